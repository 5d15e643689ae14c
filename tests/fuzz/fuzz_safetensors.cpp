// Fuzzes safetensors files (checkpoint::SafetensorsFile::open validates the header), then reads
// every tensor it accepted byte by byte, so a range the validation let through that lies outside
// the file is an ASan report here.
//
// Two input forms. Raw: the file's bytes. Or, when the input starts with '{', the JSON header,
// then a NUL byte and the data section: the target writes the 8-byte length itself, so mutations
// that change the header's length still reach the JSON checks (in the raw form almost none do).
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "titan/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = titan::fuzz::scratch_folder() / "model.safetensors";
  const std::string_view input = titan::fuzz::as_text(data, size);
  if (!input.empty() && input.front() == '{') {
    const size_t header_end = std::min(input.find('\0'), input.size());
    const uint64_t length = header_end;
    std::string file(reinterpret_cast<const char*>(&length), 8);
    file += input.substr(0, header_end);
    if (header_end < input.size()) file += input.substr(header_end + 1);
    titan::fuzz::write_file(path, file);
  } else {
    titan::fuzz::write_file(path, input);
  }
  return titan::fuzz::expect_clear_errors([&] {
    const auto file = titan::checkpoint::SafetensorsFile::open(path);
    uint8_t sum = 0;
    for (const auto& [name, entry] : file.entries()) {
      const titan::Tensor t = file.get(name);
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) sum ^= bytes[i];
    }
    // Keeps the reads: the optimizer may not drop a loop whose result is written somewhere.
    static volatile uint8_t sink;
    sink = sink ^ sum;
  });
}
