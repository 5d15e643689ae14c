// Fuzzes the job config: TOML text, then command-line overrides, as `titan train` reads them.
// Input: the TOML, then each override after a NUL byte ("[training]\nsteps = 5\0--job.print_config").
// A config that parses must also survive its own round trip: to_toml() reads back to an equal
// JobConfig (config.h promises it; the run folder's resolved config depends on it).
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "titan/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = titan::fuzz::as_text(data, size);
  const size_t toml_end = std::min(input.find('\0'), input.size());
  std::vector<std::string> overrides;
  for (size_t at = toml_end; at < input.size();) {
    const size_t next = std::min(input.find('\0', at + 1), input.size());
    overrides.emplace_back(input.substr(at + 1, next - at - 1));
    at = next;
  }
  return titan::fuzz::expect_clear_errors([&] {
    const titan::train::JobConfig config = titan::train::parse_config(input.substr(0, toml_end), "fuzz.toml", overrides);
    const std::string resolved = titan::train::to_toml(config);
    if (!(titan::train::parse_config(resolved, "resolved.toml") == config)) {
      std::fprintf(stderr, "to_toml() does not read back to the same config:\n%s\n", resolved.c_str());
      std::abort();
    }
  });
}
