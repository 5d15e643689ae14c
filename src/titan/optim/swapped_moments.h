// An optimizer's per-element state of a list of tensors (AdamW's two moments, Muon's one momentum
// buffer), kept in a SwapStore and streamed through working memory chunk by chunk: while chunk i is visited (updated), an I/O thread writes chunk i-1 back
// and then reads chunk i+1 into the buffer chunk i-1 left, so two chunk buffers are all that is
// resident and the transfers overlap the update.
//
// Layout: the tensors' elements one after another, each tensor starting on a 16-element boundary
// (so every piece a chunk hands out is as aligned as a whole tensor), cut into chunks of
// chunk_elems elements; in the store chunk c holds its exp_avg values, then (two arrays) its
// exp_avg_sq ones.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "titan/optim/swap_store.h"

namespace titan::optim {

class SwappedMoments {
 public:
  // sizes: the tensors' element counts; chunk_bytes: every array of one chunk (rounded down to
  // whole 4 KiB pages of each, at least one); arrays: f32 values per element, 2 (AdamW's
  // exp_avg and exp_avg_sq) or 1 (Muon's momentum buffer, in exp_avg).
  SwappedMoments(std::vector<int64_t> sizes, int64_t chunk_bytes, std::unique_ptr<SwapStore> store, int arrays = 2);
  ~SwappedMoments();
  SwappedMoments(const SwappedMoments&) = delete;
  SwappedMoments& operator=(const SwappedMoments&) = delete;

  // The part of one tensor's moments in one chunk: elements [begin, begin + n) of tensor `tensor`.
  struct Piece {
    int tensor;
    int64_t begin, n;
    float* exp_avg;
    float* exp_avg_sq;  // null with one array
  };
  enum class Access {
    read,       // visit the stored values; nothing is written back
    update,     // visit and write back what the visitor changed
    overwrite,  // the visitor sets every value (the buffer starts undefined); written back
  };
  // Calls visit(piece) for every piece, in tensor order and element order. Store errors surface
  // here, after the transfers in flight have finished.
  void for_each(Access access, const std::function<void(const Piece&)>& visit);

  int64_t chunk_count() const { return int64_t(chunks_.size()); }
  // Working memory the moments take: the chunk buffers (two, or one when one chunk holds all).
  int64_t resident_bytes() const;
  int64_t stored_bytes() const;
  const SwapStore& store() const { return *store_; }

 private:
  struct Chunk {
    int64_t offset;              // in the store
    int64_t elems, padded;       // elements, and the same rounded up to whole pages
    int first_piece, end_piece;  // into pieces_
  };
  struct PieceAt {  // a Piece before it has a buffer: `at` elements into the chunk
    int tensor;
    int64_t begin, n, at;
  };
  struct Job {
    int64_t write_chunk = -1, read_chunk = -1;
    std::byte* buffer = nullptr;
  };
  std::span<std::byte> bytes_of(const Chunk& c, std::byte* buffer) const;
  void run_io(const Job& job);
  void submit(const Job& job);
  void wait();
  void io_loop();
  void free_buffers();

  std::unique_ptr<SwapStore> store_;
  int arrays_;
  std::vector<Chunk> chunks_;
  std::vector<PieceAt> pieces_;
  int64_t buffer_bytes_ = 0;
  std::byte* buffers_[2] = {nullptr, nullptr};
  void* allocations_[2] = {nullptr, nullptr};

  std::thread io_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;
  bool pending_ = false, stop_ = false;
  std::exception_ptr error_;
};

}  // namespace titan::optim
