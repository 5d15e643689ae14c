// DeepSeek-V3 mixture of experts (TorchTitan's models/common/moe.py): a router in f32 picks
// top_k of E routed SwiGLU experts per token (softmax or sigmoid scores, optional group-limited
// routing, route_norm, route_scale), the chosen experts run as grouped GEMMs over tokens sorted
// by expert, and their outputs, weighted by the router, are summed back per token and added to
// the shared experts' (a dense SwiGLU FFN every token passes through).
//
// Load balancing: aux-loss-free (a per-expert bias that only steers the choice, updated by
// update_load_balance() after each optimizer step) and, optionally, DeepSeek-V3's
// sequence-wise auxiliary loss.
//
// DeepSeek-V4's MoE (transformers' DeepseekV4SparseMoeBlock, models/deepseek_v4/moe.h) is this
// module configured: sqrtsoftplus scores, the clamped SwiGLU (swiglu_limit) in every expert,
// transformers' N(0, std) init, and in its hash_moe layers hash routing: each token's experts are
// a frozen table's row at its token id (tid2eid [V, K] i64, a state buffer, in place of
// expert_bias), chosen before any expert-parallel exchange, so the ids never travel.
//
// Parameter and buffer names match TorchTitan's deepseek_v3: router.gate.weight [E, D],
// experts.w1 [E, F, D], experts.w2 [E, D, F], experts.w3 [E, F, D] (this rank's E / ep of them
// under expert parallelism), shared_experts.w{1,2,3}.weight, expert_bias [E], tokens_per_expert [E].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "titan/autograd/quantized_grouped_matmul.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/kernels/activation.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/moe_router_params.h"
#include "titan/models/block_ffn.h"
#include "titan/nn/layers.h"

namespace titan::distributed {
class ProcessGroup;
}

namespace titan::models::moe {

using autograd::Variable;

struct MoEArgs {
  int64_t dim = 0;            // D
  int64_t moe_inter_dim = 0;  // F, the hidden width of one expert
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;     // shared FFN hidden = F * n_shared_experts; 0: none
  int64_t n_activated_experts = 1;  // top_k
  kernels::RouterScore score_func = kernels::RouterScore::softmax;
  bool route_norm = false;
  double route_scale = 1.0;
  int64_t n_expert_groups = 1;   // group-limited routing: groups of experts ...
  int64_t n_limited_groups = 1;  // ... of which each token may use this many (1 / 1: off)
  double load_balance_coeff = 1e-3;  // bias update rate of aux-loss-free balancing; 0 disables
  double aux_loss_alpha = 0;         // sequence-wise auxiliary loss coefficient; 0 disables
  // Tensor parallelism (torchtitan-npu's MoE TP fix; null or one rank: none): the layer takes and
  // returns this rank's sequence piece [N / tp, D]; the router and the routed experts (replicated)
  // see only those tokens, with no TP communication; the shared experts run tensor-parallel
  // (all-gather, column / row-parallel, reduce-scatter).
  const distributed::ProcessGroup* tp = nullptr;
  // TorchTitan v0.2's scheme instead: the layer all-gathers the tokens, every rank routes all of
  // them (the same choices) through its 1/tp of every routed expert's hidden units (w1, w3 split
  // on dim 1, w2 on dim 2) and of the shared experts', and the partial sums are reduce-scattered.
  bool tp_gather = false;
  // Expert parallelism (distributed/expert_parallel.h; null or one rank: none): this rank holds
  // routed experts [r E/ep, (r+1) E/ep); the rows routed to other ranks' experts travel there and
  // back by all-to-all. With the MoE TP fix the TP ranks are in the group (each routes its own
  // tokens); with tp_gather (TorchTitan's expert-tensor parallelism) they are not: each TP rank
  // dispatches all the tokens over its own group, to its slice of the experts' hidden units.
  const distributed::ProcessGroup* ep = nullptr;
  // DeepSeek-V4. swiglu_limit: every expert's SwiGLU (routed and shared) clamps its inputs so
  // (kernels/activation.h). hash_routing: the choice is tid2eid [vocab_size, K] at the token ids
  // forward_with_aux is given; no balancing bias (the scores only weight the fixed experts).
  // normal_init_std > 0: every weight N(0, normal_init_std) (transformers' init) instead of
  // TorchTitan's truncated, depth-scaled one.
  double swiglu_limit = kernels::kNoSwigluLimit;
  bool hash_routing = false;
  int64_t vocab_size = 0;  // tid2eid's rows under hash_routing
  double normal_init_std = 0;
  int64_t ep_degree() const;
  kernels::RouterParams router_params() const;
  void validate() const;  // throws with a hint on inconsistent sizes
};

// Dense SwiGLU FFN, w2(silu(w1 x) * w3 x): the shared experts (and DeepSeek's dense layers);
// with a finite swiglu_limit, V4's clamped SwiGLU.
class FeedForward : public nn::Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, double init_std, double swiglu_limit = kernels::kNoSwigluLimit);
  Variable forward(const Variable& x) const;  // x [..., D] -> [..., D]
  nn::Linear &w1, &w2, &w3;
  const double swiglu_limit;
};

// Holds the router's gate; the routing itself runs inside MoE::forward.
class TokenChoiceTopKRouter : public nn::Module {
 public:
  TokenChoiceTopKRouter(int64_t dim, int64_t experts, double init_std);
  nn::Linear& gate;  // [E, D], f32 always: routing runs in f32 under mixed precision too
};

// The routed experts' stacked SwiGLU weights.
class GroupedExperts : public nn::Module {
 public:
  GroupedExperts(int64_t dim, int64_t hidden, int64_t experts, double init_std);
  nn::Parameter &w1, &w2, &w3;  // [E, F, D], [E, D, F], [E, F, D]
};

// Tokens per expert since the last load_stats() call, over the routed experts.
struct ExpertLoad {
  int64_t tokens = 0;    // token-expert assignments counted
  double min = 0, max = 0;  // fewest / most assignments of one expert
  double imbalance = 0;  // max / mean (1 is perfect balance; 0 when nothing was routed)
};

// Adds one MoE layer's load to a model's step_stats() (CausalLM): in detail, named as the
// metrics log groups them, "moe_imbalance/layer<L>", "moe_load_min/layer<L>",
// "moe_load_max/layer<L>"; in the summary, "moe_imbalance_max", the largest over the layers.
void append_load_stats(StepStats& stats, int layer, const ExpertLoad& load);

class MoE : public models::BlockFeedForward {
 public:
  // init_std: the std of the output-side weights (TorchTitan's depth-scaled init).
  MoE(const MoEArgs& args, double init_std);

  struct Output {
    Variable y;         // [B, S, D], x's dtype
    Variable aux_loss;  // [1] f32, already times aux_loss_alpha; undefined when the loss is off
  };
  // x [B, S, D] ([N / tp, D] under TP; token_ids then every TP rank's ids [N], in rank order)
  // -> routed + shared experts. Counts the tokens each expert
  // receives (for the bias update and load_stats) when grad mode is on. token_ids: x's tokens'
  // ids, B S contiguous i32, which hash routing reads (learned routing ignores them).
  Output forward_with_aux(const Variable& x, const Tensor& token_ids = Tensor());
  // As a block's FFN: the output; the balance loss, when on, appended to aux as "moe_aux_loss"
  // (the step's metric sums the layers').
  Variable forward(const Variable& x, AuxLosses* aux = nullptr) override;
  // tokens_per_expert summed over data-parallel ranks (plus the frozen steps' loads), then
  // update_load_balance().
  void end_step(const SumOverData& sum_over_data) override;
  // A step that trained nothing of this block (DeepSeek-V3.2's dense warm-up): its loads, summed
  // over data-parallel ranks, wait in warmup_tokens_per_expert for the next update.
  void end_frozen_step(const SumOverData& sum_over_data) override;
  void append_stats(StepStats& stats, int layer) override { append_load_stats(stats, layer, load_stats()); }
  // Under the MoE TP fix the shared experts' gather and reduce-scatter overlap their GEMMs (the
  // routed experts have no TP collective). TorchTitan's gather scheme stays synchronous: its
  // one reduce-scatter sums the routed and shared experts' partial sums together.
  void set_async_tensor_parallel(bool on) override { async_tp_ = on; }

  // [model] converters (models/converters.h): the routed experts' grouped GEMMs and the token
  // permute / unpermute, each fused (the default: the whole routed path is one recorded op over
  // the kernels) or small-op (the path is then composed of autograd ops, each pair of forms
  // choosable apart, in f32; not under expert parallelism, whose exchanges sit inside the op).
  void set_forms(autograd::OpForm grouped_mm, autograd::OpForm permute);

  // [model] converters "quantize.grouped_mm.*" (models/quantize.h): the routed experts' three
  // grouped GEMMs under a low-precision recipe (autograd/quantized_grouped_matmul.h), on the
  // fused path only (refused with the small-op forms, expert parallelism or TP's gather scheme);
  // nullopt: high precision. wgrad's token tiles restart at each expert's and each sequence's
  // first row, so the result does not depend on how FSDP splits the batch.
  void set_quantize(std::optional<autograd::LowPrecision> recipe);
  std::optional<autograd::LowPrecision> quantize() const { return quantize_; }

  // After each optimizer step: expert_bias += coeff * sign(mean load - load), shifted to zero
  // mean, then the counts restart. A no-op for the bias when load_balance_coeff is 0, or under
  // hash routing (no bias).
  void update_load_balance();
  // Load since the previous call (independent of update_load_balance's window), then resets.
  ExpertLoad load_stats();

  const MoEArgs& args() const { return args_; }

  TokenChoiceTopKRouter& router;
  GroupedExperts& experts;
  FeedForward* shared_experts = nullptr;  // null when n_shared_experts is 0
  Tensor expert_bias;        // [E] f32 buffer, only steers the choice (undefined under hash routing)
  Tensor tid2eid;            // [V, K] i64 buffer, hash routing's frozen choice (else undefined)
  Tensor tokens_per_expert;  // [E] f32 buffer, this rank's assignments since the last end of step
  // [E] f32 buffer: the frozen steps' assignments since the last bias update, summed over the
  // data-parallel ranks (the same on every rank, so checkpoints keep it; a checkpoint without it
  // leaves zeros).
  Tensor warmup_tokens_per_expert;

 private:
  // The router and the routed experts on x [B, S, D] (under TP with tp_gather: partial sums of
  // this rank's hidden units; under EP: through the experts of the group's ranks).
  Output routed(const Variable& x, const Tensor& token_ids);
  // routed() as autograd ops, in the forms set_forms chose: the router (one op), permute, the
  // experts' grouped GEMMs and SwiGLU, unpermute.
  Output routed_composed(const Variable& x, const Tensor& token_ids);
  // The routing of t tokens from their logits [T, E] f32: scores [T, E], the chosen experts
  // idx [T, K] i32 (biased top-k, or tid2eid at token_ids) and their gate weights [T, K].
  void route(Tensor& scores, Tensor& idx, Tensor& weights, const Tensor& logits, const Tensor& token_ids) const;
  // Counts each expert's tokens of a training forward (tokens_per_expert, load_stats).
  void count_tokens(const kernels::ExpertDispatch& disp);
  MoEArgs args_;
  autograd::OpForm grouped_mm_form_ = autograd::OpForm::fused, permute_form_ = autograd::OpForm::fused;
  std::vector<int64_t> stats_counts_;  // [E], assignments since the last load_stats()
  bool async_tp_ = false;
  std::optional<autograd::LowPrecision> quantize_;
  autograd::QuantizedExperts quantized_w1_, quantized_w2_, quantized_w3_;  // per step (parameters epoch)
};

}  // namespace titan::models::moe
