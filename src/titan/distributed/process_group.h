// ProcessGroup: the collectives of a set of ranks, asynchronous. Every call enqueues one request
// for this process's communication thread (comm_engine.h), which issues them in program order,
// so the n-th collective of a group is the same call on every member; it returns a Work to wait
// on. OpenMP workers never call MPI; only the communication thread does.
//
// Reductions are deterministic: a reduce-scatter is an all-to-all of the chunks followed by a
// sum over the sources as a binary tree, ((x_0 + x_1) + (x_2 + x_3)) for four ranks, in f32
// (bf16 inputs widened). tree_sum.h adds micro-batches with the same tree, so with power-of-two
// counts a layout that reduces over ranks, over shard groups then replicas, or over ranks then
// micro-batches gets the same bits as one rank accumulating all of them. An all-reduce is that
// reduce-scatter followed by an all-gather (small ones: an all-gather and the same tree). bf16
// is moved as 16-bit words.
//
// Tensors are contiguous; the request keeps them alive until it completes. A group of one rank
// completes every call at once, without MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::distributed {

enum class ReduceOp : uint8_t { sum, max, min };

struct WorkState;

// A handle on one enqueued collective. wait() blocks until it completed; the time spent blocked
// counts as exposed communication (comm_engine.h: exposed_seconds). Default: already complete.
// A request the communication thread could not complete (it failed: comm_engine.h) makes wait()
// throw a titan::Error naming what failed; settle() waits the same way without throwing, for
// destructors, which only need the request to be done with their buffers.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  void wait() const;
  void settle() const noexcept;
  bool completed() const;

 private:
  std::shared_ptr<WorkState> state_;
};

class ProcessGroup {
 public:
  ProcessGroup(int engine_group, std::string name, int rank, std::vector<int> world_ranks);

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // this process's rank in the group
  int size() const { return int(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // in group-rank order

  // In place over the group.
  Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) const;
  // out [n] receives the reduction of chunk rank() of every member's in [size() * n].
  Work reduce_scatter(const Tensor& out, const Tensor& in) const;
  // out [size() * n] receives every member's in [n], in group-rank order.
  Work all_gather(const Tensor& out, const Tensor& in) const;
  // Chunk j of in [size() * n] goes to member j; out [size() * n] holds chunk j from member j.
  Work all_to_all(const Tensor& out, const Tensor& in) const;
  // As all_to_all with counts: send_counts[j] elements of in go to member j (consecutively, in
  // member order), recv_counts[j] elements arrive from member j.
  Work all_to_allv(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& recv_counts) const;
  Work broadcast(const Tensor& t, int root) const;
  Work send(const Tensor& t, int peer, int tag = 0) const;
  Work recv(const Tensor& t, int peer, int tag = 0) const;
  Work barrier() const;
  // Host values (a step's loss, a gradient norm), reduced in double, exactly and in rank order; blocks.
  void all_reduce(std::span<double> values, ReduceOp op = ReduceOp::sum) const;
  // Every member's string, in group-rank order; blocks.
  std::vector<std::string> all_gather(const std::string& text) const;

  int engine_group() const { return engine_group_; }

 private:
  int engine_group_;
  std::string name_;
  int rank_;
  std::vector<int> world_ranks_;
};

}  // namespace titan::distributed
