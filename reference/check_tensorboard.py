"""Reads a titan run's TensorBoard event files with TensorBoard's own loader and checks them
against the run's metrics.jsonl: every training step's loss, grad norm and lr, and every
validation loss, at the same step (as float32, which is what an event stores).

    reference/.venv/bin/python reference/check_tensorboard.py RUN_DIR [TB_SUBFOLDER]

Developer-only (needs the `tensorboard` package); the C++ tests read the same files back with
titan's own record reader."""
import json
import struct
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    run = Path(sys.argv[1])
    tb = run / (sys.argv[2] if len(sys.argv) > 2 else "tb")
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    scalars = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    want = {"loss_metrics/global_avg_loss": "loss", "grad_norm": "grad_norm", "lr": "lr"}
    checked = 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        if j.get("kind") == "train":
            for tag, key in want.items():
                assert scalars[tag][j["step"]] == f32(j[key]), (tag, j["step"], scalars[tag][j["step"]], j[key])
                checked += 1
        elif j.get("kind") == "validation":
            assert scalars["validation_metrics/loss"][j["step"]] == f32(j["loss"]), j
            checked += 1
    assert checked > 0, "no steps in metrics.jsonl"
    print(f"tensorboard {len(tags)} scalar tags; {checked} values equal metrics.jsonl: {', '.join(sorted(tags)[:8])}, ...")


if __name__ == "__main__":
    main()
