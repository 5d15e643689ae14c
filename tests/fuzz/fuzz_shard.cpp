// Fuzzes token shards (data::ShardReader checks the header, sizes and offsets on open; with
// verify, the checksum and every id), then copies out every document it accepted, so offsets the
// checks let through that point outside the file are an ASan report here.
#include <vector>

#include "fuzz_support.h"
#include "titan/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = titan::fuzz::scratch_folder() / "shard.bin";
  titan::fuzz::write_file(path, titan::fuzz::as_text(data, size));
  return titan::fuzz::expect_clear_errors([&] {
    for (const bool verify : {false, true}) {
      const titan::data::ShardReader shard(path.string(), verify);
      const auto offsets = shard.document_offsets();
      std::vector<int32_t> tokens;
      for (size_t d = 0; d + 1 < offsets.size(); ++d) {
        tokens.resize(offsets[d + 1] - offsets[d]);
        shard.copy_tokens(int64_t(offsets[d]), int64_t(tokens.size()), tokens.data());
      }
    }
  });
}
