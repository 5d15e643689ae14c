// TensorBoard event files ([metrics] enable_tensorboard): scalars TensorBoard's own reader loads.
// A file is a sequence of records, each
//   uint64 length | uint32 masked CRC-32C of the length | length bytes of an Event | uint32 masked CRC-32C of them
// (little-endian; the mask rotates the CRC right by 15 and adds 0xa282ead8). The Events are
// protobuf messages (tensorboard_event.proto) and the CRC is Boost.CRC's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace titan::train {

// CRC-32C (Castagnoli) of `bytes`, masked as TensorBoard's records store it.
uint32_t masked_crc32c(std::span<const unsigned char> bytes);

class TensorBoardWriter {
 public:
  // Creates `folder` and in it events.out.tfevents.<seconds>.<host>.<pid>.<n>[.<suffix>], starting with
  // the file-version record TensorBoard expects.
  explicit TensorBoardWriter(const std::filesystem::path& folder, const std::string& suffix = {});
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with these scalars (tag, value); flushed, so a live TensorBoard sees it.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::filesystem::path& file() const { return file_; }

 private:
  void write_record(const std::string& bytes);
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::filesystem::path file_;
  std::unique_ptr<std::FILE, Close> out_;
};

struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;
};

// Every scalar of an event file, in order, after checking each record's framing and both CRCs;
// a damaged or truncated record is an error naming the file and the record's byte offset.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::filesystem::path& file);

}  // namespace titan::train
