#include "titan/train/comm_plan.h"

namespace titan::train::plan {

namespace {

// Whether FSDP gathers a unit again for its backward, as distributed/fsdp.cpp decides it.
bool reshards_after_forward(distributed::ReshardAfterForward policy, bool output_head, bool pipeline) {
  switch (policy) {
    case distributed::ReshardAfterForward::always: return true;
    case distributed::ReshardAfterForward::never: return false;
    case distributed::ReshardAfterForward::per_unit: return !output_head && !pipeline;
  }
  return true;
}

// FSDP: each unit's all-gather before forward (and again before backward when freed after
// forward) and its gradients' reduce-scatter, per micro-batch, under PP too with FSDP's zero3
// (per step instead, once per step: units stay gathered and gradients are reduced after the last
// micro-batch); routed experts under EP over the
// expert-FSDP group. HSDP's all-reduce of the shards over the replicas; DDP's of everything.
void data_parallel(const PlanJob& j, const std::vector<Local>& params, std::vector<PlanCollective>& out) {
  const PlanMesh& m = j.m;
  const double mb = double(j.microbatches);
  if (m.fsdp() > 1) {
    double gather = 0, grads = 0, shard_grads = 0;
    for (const Local& l : params) {
      const double n = is_expert(*l.p, m) ? m.efsdp() : m.fsdp(), share = (n - 1) / n;  // a group of one sends nothing
      const double bytes = l.gathered * (j.bf16 && l.p->gemm ? 2 : 4);
      const bool output = l.unit == PlannedParam::kHead;
      const bool reshard = reshards_after_forward(j.c.parallelism.fsdp_reshard_after_forward, output, j.fsdp_per_step());
      gather += share * (l.unit == kRootUnit ? bytes : bytes * (reshard ? 2 : 1) * (j.fsdp_per_step() ? 1 : mb));
      grads += share * l.gathered * 4;
      shard_grads += l.shard * 4;
    }
    out.push_back({"fsdp", "all_gather", gather, "parameters before forward (and backward, resharded units)"});
    out.push_back({"fsdp", "reduce_scatter", grads * (j.fsdp_per_step() ? 1 : mb), "f32 gradients into the shards"});
    // Muon's owner-compute (optim/muon.h): each split matrix's rows but its owner's go to the
    // owner and come back orthogonalised; over the group 2 (n - 1) / n of each matrix, a rank's
    // share 1 / n of that (balanced by Newton-Schulz cost, so by size only roughly).
    if (j.c.optimizer.name == OptimizerKind::muon) {
      const plan::MuonSplit split = plan::muon_split(params, m, false);
      if (split.sent > 0)
        out.push_back({"fsdp", "all_to_all", split.sent * 4,
                       "Muon: matrix rows to their owners and back, orthogonalised (the group's mean)"});
    }
    // The minimum: once per step (this implementation reduces each micro-batch's shards, which
    // keeps HSDP bit-identical to one rank: accumulation times this).
    if (m.dp_replicate > 1)
      out.push_back({"dp_replicate", "all_reduce", 2.0 * (m.dp_replicate - 1) / m.dp_replicate * shard_grads,
                     "HSDP: each shard's gradients over the replicas (the minimum, once per step)"});
  } else if (m.dp_replicate > 1) {
    double grads = 0;
    for (const Local& l : params) grads += l.elems * 4;
    out.push_back({"dp_replicate", "all_reduce", 2.0 * (m.dp_replicate - 1) / m.dp_replicate * grads, "DDP gradients"});
  }
}

// TP: per block two all-gathers of the sequence-parallel activations and two reduce-scatters,
// forward and backward; the partial gradients of replicated weights and loss parallel's scalars.
void tensor_parallel(const PlanJob& j, const std::vector<Local>& params, const StagePart& part,
                     std::vector<PlanCollective>& out) {
  const PlanMesh& m = j.m;
  const double mb = double(j.microbatches), tokens = double(j.micro_tokens);
  const double share = double(m.tp - 1) / m.tp, x = tokens * double(j.model.dim) * (j.bf16 ? 2 : 4);
  const double pairs = 2.0 * double(part.blocks().size()) + 1;
  out.push_back({"tp", "all_gather", 2 * pairs * share * x * mb, "sequence-parallel inputs of column-parallel GEMMs"});
  out.push_back({"tp", "reduce_scatter", 2 * pairs * share * x * mb, "outputs of row-parallel GEMMs"});
  double replicated = 0;
  for (const Local& l : params)
    // Whole parameters whose gradients are partial sums (a replicated one computed the same on
    // every rank, as DeepSeek's indexer, has nothing to sum).
    if (l.p->tp_partial_grad && !is_expert(*l.p, m))
      replicated += l.elems * 4;
  out.push_back({"tp", "all_reduce", 2 * share * (replicated + 3 * tokens * 4 * mb),
                 "replicated weights' partial gradients, loss parallel"});
  // Muon's owner-compute (optim/muon.h) over dp_shard x cp x tp: each TP-split matrix's pieces but
  // its owner's there and back, orthogonalised (the group's mean).
  if (j.c.optimizer.name == OptimizerKind::muon) {
    const plan::MuonSplit split = plan::muon_split(params, m, true);
    if (split.sent > 0)
      out.push_back({m.fsdp() > 1 ? "fsdp x tp" : "tp", "all_to_all", split.sent * 4,
                     "Muon: TP-split matrices' pieces to their owners and back, orthogonalised (the group's mean)"});
  }
}

// EP: each rank routes its tokens (its sequence piece under TP's MoE fix, every token under the
// gather scheme) to top-k experts; uniform routing sends (ep - 1) / ep of the rows away, in
// dispatch and combine, forward and backward.
void expert_parallel(const PlanJob& j, const StagePart& part, std::vector<PlanCollective>& out) {
  const std::vector<int64_t> experts = j.model.family->experts_per_token(j.query());
  double visits = 0;  // routed experts per token, summed over the stage's blocks
  for (const int l : part.blocks()) visits += double(experts.at(size_t(l)));
  const double tokens = double(j.micro_tokens) / (j.m.expert_tp ? 1 : j.m.tp);
  out.push_back({"ep", "all_to_all",
                 4.0 * visits * tokens * double(j.model.dim) * (j.bf16 ? 2 : 4) * (j.m.ep - 1) / j.m.ep * double(j.microbatches),
                 "token dispatch and combine (uniform routing)"});
}

// CP: what the family exchanges per token and block (llama3's ring passes K/V around; DSA
// all-gathers the latent KV and indexer keys and reduce-scatters their gradients).
void context_parallel(const PlanJob& j, const StagePart& part, std::vector<PlanCollective>& out) {
  const double scale = double(j.m.cp - 1) * double(j.micro_tokens) * double(part.blocks().size()) * double(j.microbatches);
  for (const models::ContextParallelTraffic& t : j.model.family->context_parallel_traffic(j.query()))
    out.push_back({"cp", t.op, scale * t.bytes_per_token, t.note});
}

}  // namespace

std::vector<PlanCollective> plan_traffic(const PlanJob& j, const std::vector<Local>& params, const StagePart& part) {
  std::vector<PlanCollective> out;
  data_parallel(j, params, out);
  if (j.m.tp > 1) tensor_parallel(j, params, part, out);
  if (j.m.ep > 1 && j.model.family->routed_experts) expert_parallel(j, part, out);
  if (j.m.cp > 1) context_parallel(j, part, out);
  if (j.m.pp > 1) {  // each stage boundary: the activations forward, their gradients backward
    const double x = double(j.micro_tokens) * double(j.model.stage_width) / j.m.tp * (j.bf16 ? 2 : 4);
    out.push_back({"pp", "send", 2 * x * double(j.microbatches), "activations forward, their gradients backward (per stage boundary)"});
  }
  return out;
}

}  // namespace titan::train::plan
