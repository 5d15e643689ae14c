#include "titan/checkpoint/staged_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace titan::checkpoint {

namespace fs = std::filesystem;

StagedFile::StagedFile(fs::path path, const std::vector<HeaderEntry>& entries,
                       const std::map<std::string, std::string>& metadata, int64_t staging_bytes)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp") {
  TITAN_CHECK(staging_bytes > 0, "the checkpoint staging buffer must hold at least one byte",
              "set checkpoint.staging_mib >= 1");
  const std::string header = safetensors_header(entries, metadata, &offsets_);
  size_t data = 0;
  for (const HeaderEntry& e : entries) data += e.bytes;
  const size_t start = 8 + header.size();
  for (size_t& o : offsets_) o += start;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) failed("cannot create", __LINE__);
  const size_t held = std::min(size_t(staging_bytes), data);
  if (held > 0) buffer_ = Tensor::empty({int64_t(held)}, DType::u8, MemCategory::temporaries);
  const uint64_t len = header.size();  // the header bypasses the buffer
  write_at(&len, 8, 0);
  write_at(header.data(), header.size(), 8);
}

StagedFile::~StagedFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ec;
  fs::remove(tmp_, ec);  // never finished: not a file anyone should read
}

void StagedFile::failed(const std::string& what, int line) const {
  throw IOError(what + " " + tmp_.string() + ": " + std::strerror(errno), "check free disk space and permissions",
                __FILE__, line);
}

void StagedFile::write_at(const void* data, size_t bytes, size_t at) const {
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::pwrite(fd_, static_cast<const char*>(data) + done, bytes - done, off_t(at + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) failed("write failed for", __LINE__);
    done += size_t(w);
  }
}

void StagedFile::put(size_t entry, size_t at, const void* data, size_t bytes) {
  size_t to = offsets_.at(entry) + at;
  const char* from = static_cast<const char*>(data);
  while (bytes > 0) {
    if (held_ > 0 && (held_at_ + held_ != to || held_ == buffer_.nbytes())) flush();
    if (held_ == 0) held_at_ = to;
    const size_t n = std::min(bytes, buffer_.nbytes() - held_);
    std::memcpy(static_cast<char*>(buffer_.data_ptr()) + held_, from, n);
    held_ += n;
    from += n;
    to += n;
    bytes -= n;
  }
}

void StagedFile::flush() {
  if (held_ > 0) write_at(buffer_.data_ptr(), held_, held_at_);
  held_ = 0;
}

void StagedFile::finish() {
  flush();
  if (::fsync(fd_) != 0) failed("cannot flush", __LINE__);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) failed("cannot close", __LINE__);
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw IOError("cannot rename " + tmp_.string() + " to " + path_.filename().string() + ": " + ec.message(),
                        "check the folder's permissions", __FILE__, __LINE__);
}

}  // namespace titan::checkpoint
