// What the fuzz targets share: a scratch folder of this process's own for the parsers that read
// files, and the rule that titan::Error is the right answer to bad input. Anything else (another
// exception, a crash, a sanitizer report, a hang, runaway memory) reaches libFuzzer as a finding.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>

#include "titan/core/error.h"

namespace titan::fuzz {

namespace fs = std::filesystem;

// Made on first use, removed at exit. One per process: `-jobs`/`-fork` runs several side by side.
inline const fs::path& scratch_folder() {
  struct Folder {
    fs::path path;
    Folder() {
      std::string name = (fs::temp_directory_path() / "titan-fuzz-XXXXXX").string();
      path = ::mkdtemp(name.data()) ? fs::path(name) : fs::path();
      if (path.empty()) ::abort();  // the harness cannot run; not the parser's fault
    }
    ~Folder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Folder folder;
  return folder.path;
}

inline void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out.good()) ::abort();
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `parse` on one input: returning or throwing titan::Error (a clear message for bad input)
// both pass.
template <class Parse>
int expect_clear_errors(Parse&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace titan::fuzz
