#include "titan/optim/swap_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "titan/core/error.h"

namespace titan::optim {

namespace {

constexpr const char* kHint = "set [optimizer] swap_path to a folder on a local disk with room for it, or swap = \"none\"";

std::string reason(int err) { return std::strerror(err); }

}  // namespace

FileSwapStore::FileSwapStore(std::string path) : path_(std::move(path)) {
  const std::filesystem::path folder = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  TITAN_CHECK(!ec, "optimizer swap file " + path_ + ": cannot create its folder: " + ec.message(), kHint);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  TITAN_CHECK(fd_ >= 0, "optimizer swap file " + path_ + ": cannot create it: " + reason(errno), kHint);
  ::unlink(path_.c_str());
}

void FileSwapStore::reserve(int64_t bytes) {
  // posix_fallocate returns the error instead of setting errno; filesystems without it
  // (EOPNOTSUPP) get a sparse file, whose holes read as zeros too.
  int err = ::posix_fallocate(fd_, 0, bytes);
  reserved_ = err == 0;
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd_, bytes) == 0 ? 0 : errno;
  if (err != 0) {
    TITAN_FAIL("optimizer swap file " + path_ + ": cannot reserve " + std::to_string(bytes >> 20) +
                   " MiB for the optimizer state: " + reason(err),
               kHint);
  }
}

FileSwapStore::~FileSwapStore() {
  if (fd_ >= 0) ::close(fd_);
}

// Repeats `transfer` (pread or pwrite: bytes moved, or -1 with errno) until all `bytes` moved.
template <class Transfer>
void FileSwapStore::transfer_all(const char* verb, int64_t offset, size_t bytes, Transfer transfer) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = transfer(done, off_t(offset + int64_t(done)));
    if (n < 0 && errno == EINTR) continue;
    TITAN_CHECK(n > 0, "optimizer swap file " + path_ + ": " + verb + " " + std::to_string(bytes) + " bytes at " +
                           std::to_string(offset) + " failed: " + (n < 0 ? reason(errno) : std::string("nothing moved")),
                kHint);
    done += size_t(n);
  }
}

void FileSwapStore::read(int64_t offset, std::span<std::byte> dst) {
  transfer_all("reading", offset, dst.size(), [&](size_t done, off_t at) {
    return ::pread(fd_, dst.data() + done, dst.size() - done, at);
  });
}

void FileSwapStore::write(int64_t offset, std::span<const std::byte> src) {
  transfer_all("writing", offset, src.size(), [&](size_t done, off_t at) {
    return ::pwrite(fd_, src.data() + done, src.size() - done, at);
  });
}

std::string FileSwapStore::describe() const {
  std::string s = path_ + (direct_ ? " (direct I/O" : " (buffered I/O: the filesystem has no direct I/O, the page cache holds it");
  // Without fallocate the file is sparse: a disk that fills up fails at a write, mid-run.
  return s + (reserved_ ? ")" : "; its space could not be reserved in advance)");
}

}  // namespace titan::optim
