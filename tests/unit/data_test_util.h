// Helpers shared by the data/ tests: a scratch directory and a byte-level encoder.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "titan/data/prepare.h"

namespace titan::data::testing {

// A fresh directory per test, removed afterwards; named after the test so a failed run can be
// inspected by hand.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("titan_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string operator/(std::string_view name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, std::string_view content) {
  std::ofstream(path, std::ios::binary) << content;
}

// Bytes are tokens 0..255; 256 is EOS and 257 BOS, as a real tokenizer puts specials after
// its byte tokens.
inline Encoder byte_encoder(bool with_bos = false) {
  Encoder e;
  e.encode = [](std::string_view text) {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  };
  e.vocab_size = 258;
  e.eos_id = 256;
  e.bos_id = with_bos ? 257 : -1;
  return e;
}

}  // namespace titan::data::testing
