#include "titan/models/deepseek_v4/moe.h"

#include <memory>
#include <string>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/moe_router.h"

namespace titan::models::deepseek_v4 {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

kernels::RouterParams MoEArgs::router_params() const {
  kernels::RouterParams p;
  p.experts = n_routed_experts;
  p.top_k = num_experts_per_tok;
  p.score = scoring_func;
  p.route_norm = true;  // transformers always renormalises (norm_topk_prob is ignored)
  p.route_scale = routed_scaling_factor;
  return p;
}

void MoEArgs::validate() const {
  TITAN_CHECK(dim >= 1 && moe_intermediate_size >= 1,
              "deepseek_v4 moe: hidden_size " + str(dim) + ", moe_intermediate_size " + str(moe_intermediate_size),
              "both must be positive");
  TITAN_CHECK(n_routed_experts >= 1 && num_experts_per_tok >= 1 && num_experts_per_tok <= n_routed_experts,
              "deepseek_v4 moe: num_experts_per_tok " + str(num_experts_per_tok) + " of n_routed_experts " +
                  str(n_routed_experts),
              "need 1 <= num_experts_per_tok <= n_routed_experts");
  TITAN_CHECK(scoring_func != kernels::RouterScore::softmax, "deepseek_v4 moe: scoring_func \"softmax\"",
              "transformers' DeepSeek-V4 scores with \"sqrtsoftplus\" or \"sigmoid\"");
  TITAN_CHECK(swiglu_limit > 0, "deepseek_v4 moe: swiglu_limit " + std::to_string(swiglu_limit),
              "use a positive limit (V4's default is 10)");
  TITAN_CHECK(routing == MoERouting::learned || vocab_size >= 1,
              "deepseek_v4 moe: a hash_moe layer with vocab_size " + str(vocab_size),
              "its tid2eid table has one row per token id: pass the vocabulary size");
}

const char* layer_type_name(MoERouting routing) { return routing == MoERouting::hash ? "hash_moe" : "moe"; }

MoE::MoE(const MoEArgs& a)
    : router(register_module("router", std::make_unique<models::moe::TokenChoiceTopKRouter>(a.dim, a.n_routed_experts,
                                                                                             a.init_std))),
      experts(register_module("experts", std::make_unique<models::moe::GroupedExperts>(
                                             a.dim, a.moe_intermediate_size, a.n_routed_experts, a.init_std))),
      shared_experts(register_module("shared_experts", std::make_unique<models::moe::FeedForward>(
                                                           a.dim, a.moe_intermediate_size, a.init_std))),
      args_(a) {
  a.validate();
  // transformers draws every weight from N(0, initializer_range), where the V3 modules truncate
  // and scale the output side by depth.
  for (nn::Parameter* p : {&router.gate.weight, &experts.w1, &experts.w2, &experts.w3, &shared_experts.w1.weight,
                           &shared_experts.w2.weight, &shared_experts.w3.weight})
    p->init = nn::Init::normal(0, a.init_std);
  if (a.routing == MoERouting::learned) {
    expert_bias = Tensor::zeros({a.n_routed_experts}, DType::f32, MemCategory::parameters);
    register_buffer("expert_bias", expert_bias);
  } else {
    tid2eid = Tensor::zeros({a.vocab_size, a.num_experts_per_tok}, DType::i64, MemCategory::parameters);
    register_buffer("tid2eid", tid2eid);
  }
}

Tensor MoE::hash_choice(const Tensor& token_ids, int64_t tokens) const {
  TITAN_CHECK(token_ids.defined(),
              "deepseek_v4 moe: a hash_moe layer got no token ids (its experts are tid2eid[token id])",
              "pass the layer's input ids [T] (i32) to forward; the inputs_embeds path cannot route a hash layer");
  TITAN_CHECK(token_ids.dtype() == DType::i32 && token_ids.numel() == tokens && token_ids.is_contiguous(),
              "deepseek_v4 moe: token ids " + token_ids.str() + " for " + str(tokens) + " tokens",
              "pass one contiguous i32 id per token of h");
  const int64_t vocab = args_.vocab_size, k = args_.num_experts_per_tok, e = args_.n_routed_experts;
  Tensor idx = Tensor::empty({tokens, k}, DType::i32, MemCategory::activations);  // [T, K]
  const int32_t* ids = token_ids.data<int32_t>();
  const int64_t* table = tid2eid.data<int64_t>();
  int32_t* out = idx.data<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TITAN_CHECK(ids[t] >= 0 && ids[t] < vocab,
                "deepseek_v4 moe: token id " + str(ids[t]) + " at " + str(t) + " outside tid2eid's " + str(vocab) +
                    " rows",
                "ids must be below vocab_size");
    for (int64_t j = 0; j < k; ++j) {
      const int64_t expert = table[ids[t] * k + j];
      TITAN_CHECK(expert >= 0 && expert < e,
                  "deepseek_v4 moe: tid2eid[" + str(ids[t]) + ", " + str(j) + "] = " + str(expert) + " of " + str(e) +
                      " experts",
                  "load a tid2eid whose entries are expert ids in [0, n_routed_experts)");
      out[t * k + j] = int32_t(expert);
    }
  }
  return idx;
}

Variable MoE::forward(const Variable& h, const Tensor& token_ids) const {
  ProfileScope prof("v4_moe.fwd");
  const kernels::RouterParams rp = args_.router_params();
  const int64_t e = rp.experts, k = rp.top_k;
  TITAN_CHECK(h.shape().size() == 2 && h.shape()[1] == args_.dim,
              "deepseek_v4 moe: input " + h.shape().str() + " for hidden_size " + str(args_.dim),
              "pass the tokens flattened, [T, " + str(args_.dim) + "]");
  TITAN_CHECK(experts.w1.var.shape()[0] == e,
              "deepseek_v4 moe: this rank holds " + str(experts.w1.var.shape()[0]) + " of the " + str(e) +
                  " routed experts",
              "the V4 MoE block runs every expert on one rank: use expert_parallel_degree = 1");
  const int64_t tokens = h.shape()[0];

  // Router in f32 (as DeepSeek's reference; transformers' activation-dtype router is the same in
  // f32): logits [T, E] by the autograd GEMM, the choice and weights [T, K] as one op whose
  // gradient reaches the logits through the chosen scores only.
  const Variable logits = autograd::linear(autograd::cast(h, DType::f32), router.gate.weight.var);  // [T, E]
  Tensor scores = Tensor::empty({tokens, e}, DType::f32, MemCategory::activations);                 // [T, E]
  Tensor weights = Tensor::empty({tokens, k}, DType::f32, MemCategory::activations);                // [T, K]
  Tensor idx;                                                                                        // [T, K] i32
  if (args_.routing == MoERouting::hash) {
    idx = hash_choice(token_ids, tokens);
    kernels::moe_router_weights_forward(scores, weights, logits.value(), idx, rp);
  } else {
    idx = Tensor::empty({tokens, k}, DType::i32, MemCategory::activations);
    kernels::moe_router_forward(scores, idx, weights, logits.value(), expert_bias, rp);
  }
  const Variable gate_weights =
      autograd::record("v4_moe_router", {logits}, weights, [=](const Tensor& dweights, autograd::GradSink& g) {
        Tensor dlogits = g.grad(0);  // [T, E]
        kernels::moe_router_backward(dlogits, dweights.contiguous(), Tensor(), scores, idx, rp);
      });

  // Routed experts over the tokens sorted by expert: [T K, d] -> [T K, F] -> [T K, d], combined
  // per token with the gate weights.
  const kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, e);
  auto gemm = [&](const Variable& a, const nn::Parameter& w) {
    return autograd::grouped_matmul(a, w.var, disp.offsets, w.compute);
  };
  const double limit = args_.swiglu_limit;
  const Variable xs = autograd::moe_permute(h, disp.pos);                                        // [T K, d]
  const Variable act = autograd::swiglu(gemm(xs, experts.w1), gemm(xs, experts.w3), limit);     // [T K, F]
  const Variable routed = autograd::moe_unpermute(gemm(act, experts.w2), disp.pos, gate_weights);  // [T, d]

  const models::moe::FeedForward& s = shared_experts;
  const Variable shared = s.w2.forward(autograd::swiglu(s.w1.forward(h), s.w3.forward(h), limit));  // [T, d]
  return autograd::add(routed, shared);
}

}  // namespace titan::models::deepseek_v4
