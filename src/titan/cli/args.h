// What every `titan` subcommand shares: its exit codes (0 done, 1 failed, 2 bad usage), --help,
// and number parsing that names the flag.
#pragma once

#include <charconv>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace titan::cli {

// A usage mistake: run_command prints it with the usage text and returns 2.
struct UsageError {
  std::string message;
};

// argv[first..argc) as views.
inline std::vector<std::string_view> arguments(int argc, char** argv, int first) {
  return first < argc ? std::vector<std::string_view>(argv + first, argv + argc) : std::vector<std::string_view>();
}

// True when any argument asks for help (-h, --help): the subcommand prints its usage and exits 0.
inline bool wants_help(const std::vector<std::string_view>& args) {
  for (const std::string_view a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// The whole of `text` as a T (an integer or a floating-point number).
template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError{fmt::format("{} expects a number, got '{}'", flag, text)};
  return value;
}

// Runs `body` and turns what it throws into an exit code: UsageError prints "titan NAME: message"
// and the usage (2), any other exception "titan NAME: error: what" (1).
int run_command(std::string_view name, std::string_view usage, const std::function<int()>& body);

}  // namespace titan::cli
