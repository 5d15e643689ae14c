// Expert parallelism (TorchTitan's ExpertParallel): a MoE layer's E routed experts are divided
// over the ep ranks of an expert-parallel group, rank r holding experts [r E/ep, (r+1) E/ep).
// Each rank routes its own tokens over all E experts and sorts the (token, choice) rows by expert
// (kernels/moe_permute.h); the rows then travel to the ranks that hold their experts:
//   counts    one all-to-all of the per-expert row counts (E / ep numbers to each peer);
//   dispatch  one all-to-all-v of the rows, which arrive grouped by source, then by expert, and
//             are regrouped by local expert (source order kept inside an expert) for the
//             grouped GEMMs;
//   combine   the mirror: the experts' output rows regrouped by source and sent home.
// Backward runs the mirror images: the gradient of dispatch is a combine, that of combine a
// dispatch. No row is dropped or padded. The reference/distributed.md section 4 has the design.
//
// The mesh (device_mesh.h) takes the ep ranks from dp_shard x cp x tp, whole TP groups at a time:
// under TP each rank routes its own sequence piece (the MoE TP fix), so the routed experts see no
// TP communication and are not replicated over TP. Under TorchTitan's gather scheme the experts'
// hidden units are split over TP instead, and each TP coordinate has its own EP groups over
// dp_shard x cp (expert-tensor parallelism). The ranks holding the same experts form the
// expert-FSDP group, over which FSDP shards and reduces them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/distributed/process_group.h"
#include "titan/nn/module.h"

namespace titan::distributed {

// `p`, declared whole [E, ...], becomes rank ep.rank()'s experts [E / ep, ...]: its shape, slice,
// initial values and checkpoint pieces are those rows; FSDP shards it over the expert-FSDP group.
void shard_experts(nn::Parameter& p, const ProcessGroup& ep);

// One MoE layer's exchange of rows between the ranks of an expert-parallel group, planned from
// the row counts (collective over ep: every member constructs it for the same layer in turn).
class ExpertExchange {
 public:
  // offsets [E + 1]: this rank's rows sorted by expert, expert e owning [offsets[e], offsets[e+1]).
  ExpertExchange(std::span<const int64_t> offsets, const ProcessGroup& ep);

  int64_t sent_rows() const { return sent_; }          // M, this rank's rows
  int64_t received_rows() const { return received_; }  // R, the rows of this rank's experts
  // [E / ep + 1]: local expert e owns rows [local_offsets[e], local_offsets[e+1]) of dispatch's output.
  const std::vector<int64_t>& local_offsets() const { return local_offsets_; }

  // rows [M, D] sorted by expert -> [R, D] every member's rows of this rank's experts, by expert.
  Tensor dispatch(const Tensor& rows) const;
  // rows [R, D] in dispatch's order -> [M, D]: each row back at its sender, in its place.
  Tensor combine(const Tensor& rows) const;

 private:
  const ProcessGroup& ep_;
  int64_t local_experts_ = 0, sent_ = 0, received_ = 0;
  std::vector<int64_t> send_rows_, recv_rows_;  // [ep] rows to / from each member
  std::vector<int64_t> from_;                   // [ep * E_local] rows from member s for local expert e, source-major
  std::vector<int64_t> local_offsets_;          // [E_local + 1]
  std::vector<int64_t> at_source_, at_expert_;  // [ep * E_local] first row of block (s, e) by source / by expert
};

}  // namespace titan::distributed
