// The device mesh: the world's ranks laid out row-major over [pp, dp_replicate, dp_shard, cp, tp]
// (tp fastest: TP peers are consecutive ranks; PP the slowest axis), as TorchTitan's
// ParallelDims. Each dimension and each flattened view the trainer uses is a ProcessGroup made
// once at start with MPI_Comm_split.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "titan/distributed/process_group.h"

namespace titan::distributed {

enum class MeshDim : uint8_t { pp, dp_replicate, dp_shard, cp, tp };
inline constexpr int kMeshDims = 5;
const char* mesh_dim_name(MeshDim d);  // "pp", "dp_replicate", ...

// The [parallelism] degrees as configured: dp_shard may be -1 ("the ranks the others leave").
struct MeshShape {
  int64_t pp = 1, dp_replicate = 1, dp_shard = -1, cp = 1, tp = 1;
};

// The degrees with -1 filled in. Throws when they do not multiply to the world size, naming the
// keys, their values and the values that would work. `source` names the config in messages.
std::array<int, kMeshDims> resolve_mesh(const MeshShape& shape, int world_size, const std::string& source);

// Throws unless expert parallelism of degree `ep` can borrow its ranks from dp_shard x cp x tp
// (it must divide their product and take whole TP groups: a multiple of tp), naming the keys and
// the degrees that would work. expert_tp: the routed experts are themselves tensor-parallel
// (TorchTitan's gather scheme, its "ETP"): EP borrows from dp_shard x cp only and must divide it.
void check_expert_degree(const std::array<int, kMeshDims>& degrees, int64_t ep, const std::string& source,
                         bool expert_tp = false);

class DeviceMesh {
 public:
  // Collective over `world`: every rank builds the same mesh, in the same order. ep, expert_tp:
  // expert parallelism's degree and where it borrows from (check_expert_degree).
  DeviceMesh(const ProcessGroup& world, const std::array<int, kMeshDims>& degrees, int ep = 1, bool expert_tp = false);
  int degree(MeshDim d) const { return degrees_[size_t(d)]; }
  int coordinate(MeshDim d) const { return coords_[size_t(d)]; }  // this rank's index along d
  const ProcessGroup& group(MeshDim d) const { return *groups_[size_t(d)]; }
  // Flattened views (TorchTitan v0.2): dp = dp_replicate x dp_shard (which samples a rank loads),
  // fsdp = dp_shard x cp (parameter shards and their gradient reduce-scatter), loss =
  // dp_replicate x dp_shard x cp (the loss and MoE loads averaged over it).
  const ProcessGroup& dp() const { return *dp_; }
  const ProcessGroup& fsdp() const { return *fsdp_; }
  const ProcessGroup& loss() const { return *loss_; }
  // dp_shard x cp x tp: the ranks that hold the pieces of a tensor-parallel parameter, FSDP's rows
  // of each TP rank's slice (Muon gathers a matrix over them). fsdp() itself without TP.
  const ProcessGroup& fsdp_tp() const { return fsdp_tp_ ? *fsdp_tp_ : *fsdp_; }
  // Expert parallelism (TorchTitan's ep / efsdp): the ranks of dp_shard x cp x tp (row-major, so
  // TP peers stay together) in consecutive runs of ep, each run dividing the routed experts; and
  // the ranks holding the same experts (the same place in their run), over which FSDP shards them.
  // With expert_tp the runs are of dp_shard x cp at one TP coordinate: TP peers hold the same
  // experts' different hidden units, each in its own EP group.
  const ProcessGroup& ep() const { return *ep_; }
  const ProcessGroup& efsdp() const { return *efsdp_; }
  int world_size() const { return world_size_; }
  // "pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1" (", ep 2" with expert parallelism)
  std::string str() const;

 private:
  // The group of ranks that differ from this one only along the dims in `mask`.
  std::unique_ptr<ProcessGroup> make_group(const ProcessGroup& world, std::array<bool, kMeshDims> mask, const std::string& name);
  std::array<int, kMeshDims> degrees_{}, coords_{};
  int world_size_ = 1, ep_degree_ = 1;
  std::array<std::unique_ptr<ProcessGroup>, kMeshDims> groups_;
  std::unique_ptr<ProcessGroup> dp_, fsdp_, loss_, ep_, efsdp_, fsdp_tp_;
};

}  // namespace titan::distributed
