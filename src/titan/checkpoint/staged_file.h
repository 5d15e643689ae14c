// A safetensors file written through one staging buffer of bounded size (checkpoint.staging_mib),
// so that a save never holds a second copy of the state it writes: the header first, then each
// entry's bytes put at their place in any order (the pieces of several entries interleaved, as a
// swap file hands optimizer moments out). Consecutive puts gather in the buffer, which is written
// (pwrite) when it fills or the next put lands elsewhere. The file is "<path>.tmp" until finish()
// has synced it and renamed it; one never finished is removed.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "titan/checkpoint/safetensors.h"

namespace titan::checkpoint {

class StagedFile {
 public:
  StagedFile(std::filesystem::path path, const std::vector<HeaderEntry>& entries,
             const std::map<std::string, std::string>& metadata, int64_t staging_bytes);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  // Copies `bytes` bytes of entry `entry`, starting `at` bytes into it, into the file.
  void put(size_t entry, size_t at, const void* data, size_t bytes);
  // Writes what the buffer holds (after it, the data put so far is in the file).
  void flush();
  // Flushes, syncs, closes and renames the file into place.
  void finish();
  size_t buffer_bytes() const { return buffer_.nbytes(); }

 private:
  [[noreturn]] void failed(const std::string& what, int line) const;
  void write_at(const void* data, size_t bytes, size_t at) const;
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  std::vector<size_t> offsets_;  // each entry's first byte in the file
  Tensor buffer_;                // the staging buffer (u8)
  size_t held_ = 0;              // bytes in the buffer
  size_t held_at_ = 0;           // where in the file they go
};

}  // namespace titan::checkpoint
