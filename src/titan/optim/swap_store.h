// Where swapped optimizer state lives between optimizer steps (MindSpeed's swap optimizer, as
// torchtitan-npu adopted it): a store of bytes that chunks are read from and written back to.
// On a CPU the store is a file on local disk; a GPU's pinned host memory is the other
// implementation the interface is shaped for (aligned offsets, whole-chunk transfers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace titan::optim {

class SwapStore {
 public:
  virtual ~SwapStore() = default;
  // Offsets, sizes and buffer addresses of read() and write() are multiples of this.
  virtual size_t alignment() const = 0;
  // Makes room for `bytes` bytes (called once, before any transfer), all reading as 0.
  virtual void reserve(int64_t bytes) = 0;
  // Blocking transfers of dst.size() / src.size() bytes at `offset`. Bytes never written read as 0.
  virtual void read(int64_t offset, std::span<std::byte> dst) = 0;
  virtual void write(int64_t offset, std::span<const std::byte> src) = 0;
  // For logs: where the state is and how it moves ("/nvme/x.swap, direct I/O").
  virtual std::string describe() const = 0;
};

// A file at `path` (its folder is created). reserve() allocates its blocks, so a disk too small
// fails before training rather than in the middle of a run (where the filesystem has no
// fallocate, the file is sparse and describe() says so), and the file is unlinked as soon as
// it is open: it holds nothing worth keeping (checkpoints hold the state), and no run, however
// it ends, leaves one behind. Direct I/O (O_DIRECT) keeps the state out of the page cache, and so
// out of the machine's memory, where the filesystem supports it; elsewhere (tmpfs) buffered I/O.
// Errors name the path, the system's reason and [optimizer] swap_path.
class FileSwapStore final : public SwapStore {
 public:
  explicit FileSwapStore(std::string path);
  ~FileSwapStore() override;
  FileSwapStore(const FileSwapStore&) = delete;
  FileSwapStore& operator=(const FileSwapStore&) = delete;

  size_t alignment() const override { return 4096; }
  void reserve(int64_t bytes) override;
  void read(int64_t offset, std::span<std::byte> dst) override;
  void write(int64_t offset, std::span<const std::byte> src) override;
  std::string describe() const override;
  bool direct_io() const { return direct_; }

 private:
  template <class Transfer>
  void transfer_all(const char* verb, int64_t offset, size_t bytes, Transfer transfer);

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  bool reserved_ = false;  // posix_fallocate allocated the blocks (else the file is sparse)
};

}  // namespace titan::optim
