#include "titan/core/error.h"

#include <cstring>

namespace titan {
namespace {

// Source paths are reported relative to the project root ("src/titan/..."), not the build's.
const char* short_path(const char* file) {
  const char* p = std::strstr(file, "src/titan/");
  if (!p) p = std::strstr(file, "tests/");
  return p ? p : file;
}

std::string compose(const std::string& message, const std::string& hint, const char* file, int line) {
  std::string s = message;
  if (!hint.empty()) s += "\n  hint: " + hint;
  s += "\n  (at " + std::string(short_path(file)) + ":" + std::to_string(line) + ")";
  return s;
}

}  // namespace

Error::Error(std::string message, std::string hint, const char* file, int line)
    : std::runtime_error(compose(message, hint, file, line)),
      message_(std::move(message)),
      hint_(std::move(hint)),
      file_(short_path(file)),
      line_(line) {}

namespace detail {
void throw_error(const char* file, int line, std::string message, std::string hint) {
  throw Error(std::move(message), std::move(hint), file, line);
}
}  // namespace detail

}  // namespace titan
