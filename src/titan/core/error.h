// Errors that say where they were raised and what the user can do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace titan {

// An error with the source location that raised it and an optional hint for the user.
// what() reads: "<message>\n  hint: <hint>\n  (at src/file.cpp:123)".
class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string hint, const char* file, int line);
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  std::string hint_;
  const char* file_;
  int line_;
};

// The operating system refused an I/O operation (open, read, map, rename: EIO, EMFILE, ENOMEM, a
// file a stale network-file-system cache does not show). Not a sign that the file's content is
// bad: a caller may retry it, and must not treat the file as damaged.
class IOError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, std::string message, std::string hint = {});
}  // namespace detail

}  // namespace titan

// TITAN_CHECK(cond, message[, hint]): throws titan::Error when cond is false.
#define TITAN_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) [[unlikely]] ::titan::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// TITAN_FAIL(message[, hint]): throws titan::Error unconditionally.
#define TITAN_FAIL(...) ::titan::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__)
