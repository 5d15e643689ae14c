"""Writes tests/fixtures/tensorboard/events.out.tfevents.fixture with TensorBoard's own event
writer: three events of scalars (tags, steps and values the C++ test expects), so titan's record
reader is checked against a file TensorBoard wrote.

    reference/.venv/bin/python reference/make_tensorboard_fixture.py"""
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/tensorboard/events.out.tfevents.fixture"


def main():
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=1.5, file_version="brain.Event:2").SerializeToString())
        for step, values in [(1, {"loss": 2.5, "lr": 0.001}), (2, {"loss": 2.25}), (10, {"validation/loss": -0.75})]:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
            w.write(event_pb2.Event(wall_time=100.0 + step, step=step, summary=summary).SerializeToString())
        w.flush()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
