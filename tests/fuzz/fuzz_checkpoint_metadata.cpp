// Fuzzes a checkpoint's metadata.json (checkpoint::CheckpointReader reads it on open; shape(),
// read() and read_full() interpret its entries), next to the shard files of a real two-rank
// checkpoint (fixtures.h), so inputs near the seeds reach the piece-by-piece reading and checksum
// checks. A damaged checkpoint must throw titan::Error (CorruptCheckpoint where it is damage): the
// trainer falls back from it to the step before.
#include <cstdlib>

#include "fixtures.h"
#include "fuzz_support.h"

namespace {

// The checkpoint's tensors are at most a few elements; a fuzzed shape may claim terabytes, which
// read_full would rightly try to allocate (the trainer reads into its model's tensors instead,
// after comparing shapes). Reading those is not what this target looks for.
bool small(const titan::Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d > 4096 || d < -4096) return false;
    n *= d < 0 ? -d : d;
    if (n > 4096) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path step = titan::fuzz::write_fixture_checkpoint(titan::fuzz::scratch_folder());
  titan::fuzz::write_file(step / "metadata.json", titan::fuzz::as_text(data, size));
  return titan::fuzz::expect_clear_errors([&] {
    titan::checkpoint::CheckpointReader reader(step);
    for (const std::string& name : reader.names()) {
      const titan::Shape shape = reader.shape(name);
      if (!small(shape)) continue;
      (void)reader.read_full(name);
      // A slice, as a sharded run reads its part: all but the first row.
      if (shape.size() >= 1 && shape[0] >= 2) {
        titan::Shape part = shape, offsets = shape;
        part[0] -= 1;
        for (int d = 0; d < offsets.size(); ++d) offsets[d] = d == 0 ? 1 : 0;
        const titan::GlobalSlice slice{shape, offsets};
        reader.read(name, titan::Tensor::empty(part, titan::DType::f32), &slice);
      }
    }
  });
}
