// Fuzzes a checkpoint's metadata.json (checkpoint::CheckpointReader reads it on open; shape(),
// read() and read_full() interpret its entries), next to the shard files of a real two-rank
// checkpoint (fixtures.h), so inputs near the seeds reach the piece-by-piece reading and checksum
// checks. A damaged checkpoint must throw titan::Error (CorruptCheckpoint where it is damage): the
// trainer falls back from it to the step before. Shapes are not capped (tiling, overflow and the
// files holding every piece are all checked before an allocation).
#include <cstdlib>

#include "fixtures.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path step = [] {
    titan::checkpoint::set_io_retry_seconds(0);  // a piece file that is not there: no pause before saying so
    return titan::fuzz::write_fixture_checkpoint(titan::fuzz::scratch_folder());
  }();
  titan::fuzz::write_file(step / "metadata.json", titan::fuzz::as_text(data, size));
  return titan::fuzz::expect_clear_errors([&] {
    titan::checkpoint::CheckpointReader reader(step);
    for (const std::string& name : reader.names()) {
      const titan::Shape shape = reader.shape(name);
      // No cap on the shapes: the reader must refuse one that overflows, or that its files do not
      // hold, before allocating it (a fuzzed shape may claim terabytes). Once the whole tensor
      // was read, its shape is backed by the files and a slice of it is small too.
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
