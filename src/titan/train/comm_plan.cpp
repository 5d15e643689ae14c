#include "titan/train/comm_plan.h"

#include "titan/models/deepseek_v3/args.h"
#include "titan/models/llama3/args.h"

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

models::deepseek_v3::DeepSeekV3Args deepseek_args(const PlanJob& j) {
  return models::deepseek_v3::deepseek_flavor(j.model.model, j.c.model.flavor, j.model.vocab);
}

// FSDP: each unit's all-gather before forward (and again before backward when freed after
// forward) and its gradients' reduce-scatter, per micro-batch (under PP once per step: units stay
// gathered and gradients are reduced after the last micro-batch); routed experts under EP over the
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
      const bool reshard = reshards_after_forward(j.c.parallelism.fsdp_reshard_after_forward, output, m.pp > 1);
      gather += share * (l.unit == kRootUnit ? bytes : bytes * (reshard ? 2 : 1) * (m.pp > 1 ? 1 : mb));
      grads += share * l.gathered * 4;
      shard_grads += l.shard * 4;
    }
    out.push_back({"fsdp", "all_gather", gather, "parameters before forward (and backward, resharded units)"});
    out.push_back({"fsdp", "reduce_scatter", grads * (m.pp > 1 ? 1 : mb), "f32 gradients into the shards"});
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
    // The indexer is computed whole on every TP rank, gradients included: nothing to sum.
    if (l.p->tp_dim < 0 && !is_expert(*l.p, m) && l.p->name.find(".indexer.") == std::string::npos)
      replicated += l.elems * 4;
  out.push_back({"tp", "all_reduce", 2 * share * (replicated + 3 * tokens * 4 * mb),
                 "replicated weights' partial gradients, loss parallel"});
}

// EP: each rank routes its tokens (its sequence piece under TP's MoE fix, every token under the
// gather scheme) to top-k experts; uniform routing sends (ep - 1) / ep of the rows away, in
// dispatch and combine, forward and backward.
void expert_parallel(const PlanJob& j, const StagePart& part, std::vector<PlanCollective>& out) {
  const auto a = deepseek_args(j);
  int moe_layers = 0;
  for (const int l : part.blocks()) moe_layers += a.is_moe_layer(l);
  const double rows = double(j.micro_tokens) / (j.m.expert_tp ? 1 : j.m.tp) * double(a.n_activated_experts);
  out.push_back({"ep", "all_to_all",
                 4.0 * moe_layers * rows * double(a.dim) * (j.bf16 ? 2 : 4) * (j.m.ep - 1) / j.m.ep * double(j.microbatches),
                 "token dispatch and combine (uniform routing)"});
}

// CP: llama3's ring passes K/V around (and K/V again plus dK/dV in backward); DSA all-gathers the
// latent KV and indexer keys along the sequence and reduce-scatters their gradients.
void context_parallel(const PlanJob& j, const StagePart& part, std::vector<PlanCollective>& out) {
  const double share = double(j.m.cp - 1), tokens = double(j.micro_tokens), eb = j.bf16 ? 2 : 4;
  const double per_step = double(part.blocks().size()) * double(j.microbatches);
  if (j.model.model == "llama3") {
    const auto a = models::llama3::llama3_flavor(j.c.model.flavor, j.model.vocab);
    const double kv = tokens * 2.0 * double(a.kv_heads() * a.head_dim()) / j.m.tp * eb;
    out.push_back({"cp", "send", 3 * share * kv * per_step, "ring attention: K/V forward, K/V and dK/dV backward"});
    return;
  }
  const auto a = deepseek_args(j);
  const double rows = tokens * double(a.kv_lora_rank + a.qk_rope_head_dim + (a.has_indexer() ? a.index_head_dim : 0));
  out.push_back({"cp", "all_gather", share * rows * eb * per_step, "latent KV and indexer keys along the sequence"});
  out.push_back({"cp", "reduce_scatter", share * rows * 4 * per_step, "their gradients back"});
}

}  // namespace

std::vector<PlanCollective> plan_traffic(const PlanJob& j, const std::vector<Local>& params, const StagePart& part) {
  std::vector<PlanCollective> out;
  data_parallel(j, params, out);
  if (j.m.tp > 1) tensor_parallel(j, params, part, out);
  if (j.m.ep > 1 && j.model.model != "llama3") expert_parallel(j, part, out);
  if (j.m.cp > 1) context_parallel(j, part, out);
  if (j.m.pp > 1) {  // each stage boundary: the activations forward, their gradients backward
    const double x = double(j.micro_tokens) * double(j.model.dim) / j.m.tp * (j.bf16 ? 2 : 4);
    out.push_back({"pp", "send", 2 * x * double(j.microbatches), "activations forward, their gradients backward (per stage boundary)"});
  }
  return out;
}

}  // namespace titan::train::plan
