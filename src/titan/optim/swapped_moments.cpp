#include "titan/optim/swapped_moments.h"

#include <algorithm>
#include <utility>

#include "titan/core/allocator.h"
#include "titan/core/error.h"

namespace titan::optim {

namespace {
constexpr int64_t kTensorAlign = 16;  // elements: 64 bytes, a cache line and an AVX-512 vector
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

SwappedMoments::SwappedMoments(std::vector<int64_t> sizes, int64_t chunk_bytes, std::unique_ptr<SwapStore> store,
                               int arrays)
    : store_(std::move(store)), arrays_(arrays) {
  TITAN_CHECK(arrays == 1 || arrays == 2, "SwappedMoments: 1 or 2 arrays per element, not " + std::to_string(arrays));
  const int64_t page_elems = int64_t(store_->alignment() / sizeof(float));
  const int64_t chunk_elems =
      std::max<int64_t>(1, chunk_bytes / int64_t(arrays * sizeof(float)) / page_elems) * page_elems;
  // Lay the tensors out one after another, cutting the sequence into chunks and each chunk into pieces.
  int64_t fill = 0;  // elements of the current chunk used so far
  auto close_chunk = [&] {
    if (fill == 0) return;
    const int first = chunks_.empty() ? 0 : chunks_.back().end_piece;
    const int64_t offset = chunks_.empty() ? 0 : chunks_.back().offset + arrays_ * chunks_.back().padded * int64_t(sizeof(float));
    chunks_.push_back({offset, fill, round_up(fill, page_elems), first, int(pieces_.size())});
    fill = 0;
  };
  for (size_t t = 0; t < sizes.size(); ++t) {
    fill = round_up(fill, kTensorAlign);
    if (fill >= chunk_elems) close_chunk();
    for (int64_t begin = 0; begin < sizes[t];) {
      const int64_t n = std::min(sizes[t] - begin, chunk_elems - fill);
      pieces_.push_back({int(t), begin, n, fill});
      begin += n;
      fill += n;
      if (fill == chunk_elems) close_chunk();
    }
  }
  close_chunk();
  store_->reserve(stored_bytes());
  buffer_bytes_ = chunks_.empty() ? 0 : arrays_ * chunk_elems * int64_t(sizeof(float));
  if (chunks_.size() == 1) buffer_bytes_ = arrays_ * chunks_[0].padded * int64_t(sizeof(float));
  const int n_buffers = chunks_.size() > 1 ? 2 : chunks_.size() == 1 ? 1 : 0;
  try {
    for (int b = 0; b < n_buffers; ++b) {
      allocations_[b] = memory_alloc(size_t(buffer_bytes_) + store_->alignment(), MemCategory::optimizer_state);
      const uintptr_t a = reinterpret_cast<uintptr_t>(allocations_[b]);
      buffers_[b] = reinterpret_cast<std::byte*>(round_up(int64_t(a), int64_t(store_->alignment())));
    }
    if (n_buffers == 2) io_ = std::thread([this] { io_loop(); });
  } catch (...) {  // the destructor does not run for a constructor that throws
    free_buffers();
    throw;
  }
}

void SwappedMoments::free_buffers() {
  for (void*& a : allocations_) {
    if (a) memory_free(a, size_t(buffer_bytes_) + store_->alignment(), MemCategory::optimizer_state);
    a = nullptr;
  }
}

int64_t SwappedMoments::resident_bytes() const {
  int64_t n = 0;
  for (void* a : allocations_)
    if (a) n += buffer_bytes_ + int64_t(store_->alignment());
  return n;
}

SwappedMoments::~SwappedMoments() {
  if (io_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    io_.join();
  }
  free_buffers();
}

int64_t SwappedMoments::stored_bytes() const {
  return chunks_.empty() ? 0 : chunks_.back().offset + arrays_ * chunks_.back().padded * int64_t(sizeof(float));
}

std::span<std::byte> SwappedMoments::bytes_of(const Chunk& c, std::byte* buffer) const {
  return {buffer, size_t(arrays_ * c.padded) * sizeof(float)};
}

void SwappedMoments::run_io(const Job& job) {
  if (job.write_chunk >= 0) {
    const Chunk& c = chunks_[size_t(job.write_chunk)];
    store_->write(c.offset, bytes_of(c, job.buffer));
  }
  if (job.read_chunk >= 0) {
    const Chunk& c = chunks_[size_t(job.read_chunk)];
    store_->read(c.offset, bytes_of(c, job.buffer));
  }
}

void SwappedMoments::io_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (pending_ && job_.buffer); });
    if (stop_) return;
    const Job job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      run_io(job);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    job_.buffer = nullptr;  // done
    cv_.notify_all();
  }
}

void SwappedMoments::submit(const Job& job) {
  {
    std::lock_guard lock(mu_);
    job_ = job;
    pending_ = true;
  }
  cv_.notify_all();
}

void SwappedMoments::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !pending_ || !job_.buffer; });
  pending_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SwappedMoments::for_each(Access access, const std::function<void(const Piece&)>& visit) {
  const int64_t n = chunk_count();
  if (n == 0) return;
  const bool reads = access != Access::overwrite, writes = access != Access::read;
  auto visit_chunk = [&](int64_t i, std::byte* buffer) {
    const Chunk& c = chunks_[size_t(i)];
    float* m = reinterpret_cast<float*>(buffer);
    float* v = arrays_ == 2 ? m + c.padded : nullptr;
    for (int p = c.first_piece; p < c.end_piece; ++p) {
      const PieceAt& a = pieces_[size_t(p)];
      visit({a.tensor, a.begin, a.n, m + a.at, v + a.at});
    }
  };
  if (reads) run_io({-1, 0, buffers_[0]});
  if (n == 1) {
    visit_chunk(0, buffers_[0]);
    if (writes) run_io({0, -1, buffers_[0]});
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    std::byte* current = buffers_[i % 2];
    std::byte* other = buffers_[(i + 1) % 2];
    // The other buffer holds chunk i-1, visited: write it back, then fill it with chunk i+1.
    Job job{writes && i > 0 ? i - 1 : -1, reads && i + 1 < n ? i + 1 : -1, other};
    const bool io = job.write_chunk >= 0 || job.read_chunk >= 0;
    if (io) submit(job);
    try {
      visit_chunk(i, current);
    } catch (...) {
      if (io) wait();
      throw;
    }
    if (io) wait();
  }
  if (writes) run_io({n - 1, -1, buffers_[(n - 1) % 2]});
}

}  // namespace titan::optim
