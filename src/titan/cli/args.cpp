#include "titan/cli/args.h"

#include <cstdio>
#include <exception>

namespace titan::cli {

int run_command(std::string_view name, std::string_view usage, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    fmt::print(stderr, "titan {}: {}\n\n{}", name, e.message, usage);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "titan {}: error: {}\n", name, e.what());
    return 1;
  }
}

}  // namespace titan::cli
