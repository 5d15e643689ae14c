#include "titan/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/crc.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "titan/core/error.h"
#include "titan/train/tensorboard_event.pb.h"

namespace titan::train {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(unsigned char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get_le(const unsigned char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(in[i]) << (8 * i);
  return v;
}

std::span<const unsigned char> as_bytes(const std::string& s) {
  return {reinterpret_cast<const unsigned char*>(s.data()), s.size()};
}

}  // namespace

uint32_t masked_crc32c(std::span<const unsigned char> bytes) {
  // Castagnoli's polynomial, reflected, initial and final XOR all ones: CRC-32C.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& folder, const std::string& suffix) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // Seconds, host, process and a counter: writers started in the same second never share a file.
  static std::atomic<int> writers{0};
  file_ = folder / ("events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." + host + "." +
                    std::to_string(::getpid()) + "." + std::to_string(writers++) + (suffix.empty() ? "" : "." + suffix));
  out_.reset(std::fopen(file_.c_str(), "wbx"));
  TITAN_CHECK(out_ != nullptr, "cannot create the TensorBoard event file " + file_.string(),
              "check that job.dump_folder is writable, or set metrics.enable_tensorboard = false");
  tensorboard::Event first;
  first.set_wall_time(now_seconds());
  first.set_file_version("brain.Event:2");
  write_record(first.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  std::array<unsigned char, 12> head{};
  put_le(head.data(), bytes.size(), 8);
  put_le(head.data() + 8, masked_crc32c({head.data(), 8}), 4);
  std::array<unsigned char, 4> tail{};
  put_le(tail.data(), masked_crc32c(as_bytes(bytes)), 4);
  const bool ok = std::fwrite(head.data(), 1, head.size(), out_.get()) == head.size() &&
                  std::fwrite(bytes.data(), 1, bytes.size(), out_.get()) == bytes.size() &&
                  std::fwrite(tail.data(), 1, tail.size(), out_.get()) == tail.size() && std::fflush(out_.get()) == 0;
  TITAN_CHECK(ok, "writing the TensorBoard event file " + file_.string() + " failed: " + std::strerror(errno),
              "free space on that disk, or set metrics.enable_tensorboard = false");
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(float(value));
  }
  write_record(event.SerializeAsString());
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  TITAN_CHECK(in.good(), "cannot open the TensorBoard event file " + file.string(), "check the path");
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  std::vector<TensorBoardScalar> out;
  size_t at = 0;
  while (at < data.size()) {
    const std::string where = file.string() + ", record at byte " + std::to_string(at);
    const std::string hint = "the file is damaged or was cut short; TensorBoard skips it from this record on";
    TITAN_CHECK(data.size() - at >= 12, where + ": " + std::to_string(data.size() - at) + " bytes left, a header needs 12",
                hint);
    const uint64_t length = get_le(bytes + at, 8);
    TITAN_CHECK(uint32_t(get_le(bytes + at + 8, 4)) == masked_crc32c({bytes + at, 8}),
                where + ": the length's CRC does not match", hint);
    TITAN_CHECK(length <= data.size() - at - 12 && data.size() - at - 12 - length >= 4,
                where + ": a record of " + std::to_string(length) + " bytes runs past the end of the file", hint);
    const std::span<const unsigned char> body(bytes + at + 12, length);
    TITAN_CHECK(uint32_t(get_le(bytes + at + 12 + length, 4)) == masked_crc32c(body),
                where + ": the event's CRC does not match", hint);
    tensorboard::Event event;
    TITAN_CHECK(event.ParseFromArray(body.data(), int(body.size())), where + ": not an Event message", hint);
    if (event.has_summary())
      for (const tensorboard::SummaryValue& v : event.summary().value())
        if (v.has_simple_value()) out.push_back({v.tag(), event.step(), v.simple_value(), event.wall_time()});
    at += 12 + length + 4;
  }
  return out;
}

}  // namespace titan::train
