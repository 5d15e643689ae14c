#include "titan/train/param_inventory.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/llama3/args.h"

namespace titan::train {

namespace {

struct Builder {
  std::vector<PlannedParam>& out;
  std::string prefix;
  int layer;
  void linear(const std::string& name, int64_t in, int64_t outs, int tp, bool gemm = true) {
    out.push_back({prefix + name + ".weight", Shape{outs, in}, layer, tp, false, gemm});
  }
  void norm(const std::string& name, int64_t dim) { out.push_back({prefix + name + ".weight", Shape{dim}, layer}); }
  void layer_norm(const std::string& name, int64_t dim) {
    norm(name, dim);
    out.push_back({prefix + name + ".bias", Shape{dim}, layer});
  }
  Builder at(const std::string& sub) const { return {out, prefix + sub + ".", layer}; }
};

// cos and sin of `dims` / 2 frequencies at every position (kernels/rope.cpp).
double rope_bytes(int64_t positions, int64_t dims) { return 2.0 * double(positions) * double(dims / 2) * 4; }

ModelShape llama3_shape(const std::string& flavor, int64_t vocab, int64_t seq_len) {
  const models::llama3::Llama3Args a = models::llama3::llama3_flavor(flavor, vocab);
  ModelShape m{"llama3", a.n_layers, a.dim, a.vocab_size, {}, rope_bytes(std::max(a.max_seq_len, seq_len), a.head_dim())};
  auto& p = m.params;
  p.push_back({"tok_embeddings.weight", Shape{a.vocab_size, a.dim}, PlannedParam::kEmbedding, 0, false,
               a.tie_embeddings});
  const int64_t q = a.n_heads * a.head_dim(), kv = a.kv_heads() * a.head_dim(), f = a.ffn_hidden();
  for (int l = 0; l < a.n_layers; ++l) {
    Builder b{p, "layers." + std::to_string(l) + ".", l};
    Builder at = b.at("attention"), ff = b.at("feed_forward");
    at.linear("wq", a.dim, q, 0);
    at.linear("wk", a.dim, kv, 0);
    at.linear("wv", a.dim, kv, 0);
    at.linear("wo", q, a.dim, 1);
    ff.linear("w1", a.dim, f, 0);
    ff.linear("w2", f, a.dim, 1);
    ff.linear("w3", a.dim, f, 0);
    b.norm("attention_norm", a.dim);
    b.norm("ffn_norm", a.dim);
  }
  Builder head{p, "", PlannedParam::kHead};
  head.norm("norm", a.dim);
  if (!a.tie_embeddings) head.linear("output", a.dim, a.vocab_size, 0);
  return m;
}

// One DeepSeek block (the main stack's, or an MTP module's).
void deepseek_block(const models::deepseek_v3::DeepSeekV3Args& a, int64_t layer_id, bool moe_tp_gather, Builder b) {
  Builder at = b.at("attention");
  const int64_t h = a.n_heads;
  if (a.q_lora_rank == 0) {
    at.linear("wq", a.dim, h * a.qk_head_dim(), 0);
  } else {
    at.linear("wq_a", a.dim, a.q_lora_rank, -1);
    at.norm("q_norm", a.q_lora_rank);
    at.linear("wq_b", a.q_lora_rank, h * a.qk_head_dim(), 0);
  }
  at.linear("wkv_a", a.dim, a.kv_lora_rank + a.qk_rope_head_dim, -1);
  at.norm("kv_norm", a.kv_lora_rank);
  at.linear("wkv_b", a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim), 0);
  at.linear("wo", h * a.v_head_dim, a.dim, 1);
  if (a.has_indexer()) {
    Builder ix = at.at("indexer");
    ix.linear("wq_b", a.q_lora_rank, a.index_n_heads * a.index_head_dim, -1);
    ix.linear("wk", a.dim, a.index_head_dim, -1);
    ix.layer_norm("k_norm", a.index_head_dim);
    ix.linear("weights_proj", a.dim, a.index_n_heads, -1);
  }
  if (!a.is_moe_layer(layer_id)) {
    Builder ff = b.at("feed_forward");
    ff.linear("w1", a.dim, a.inter_dim, 0);
    ff.linear("w2", a.inter_dim, a.dim, 1);
    ff.linear("w3", a.dim, a.inter_dim, 0);
  } else {
    Builder moe = b.at("moe");
    moe.at("router").linear("gate", a.dim, a.n_routed_experts, -1, /*gemm=*/false);
    const int64_t e = a.n_routed_experts, f = a.moe_inter_dim;
    // Under the MoE TP fix the routed experts are whole on every TP rank (or divided by EP);
    // TorchTitan's scheme splits each expert's hidden units.
    const int hidden = moe_tp_gather ? 1 : -1, hidden_w2 = moe_tp_gather ? 2 : -1;  // w1, w3 [E, F, D]; w2 [E, D, F]
    for (const auto& [name, shape, split] : {std::tuple{"w1", Shape{e, f, a.dim}, hidden},
                                             std::tuple{"w2", Shape{e, a.dim, f}, hidden_w2},
                                             std::tuple{"w3", Shape{e, f, a.dim}, hidden}})
      b.out.push_back({moe.prefix + "experts." + name, shape, b.layer, split, true, true});
    if (a.n_shared_experts > 0) {
      Builder sh = moe.at("shared_experts");
      const int64_t fs = f * a.n_shared_experts;
      sh.linear("w1", a.dim, fs, 0);
      sh.linear("w2", fs, a.dim, 1);
      sh.linear("w3", a.dim, fs, 0);
    }
  }
  b.norm("attention_norm", a.dim);
  b.norm("ffn_norm", a.dim);
}

ModelShape deepseek_shape(const std::string& model, const std::string& flavor, int64_t vocab, int64_t seq_len,
                          int64_t mtp_layers, bool moe_tp_gather) {
  namespace ds = models::deepseek_v3;
  ds::DeepSeekV3Args a = ds::deepseek_flavor(model, flavor, vocab);
  a.num_mtp_layers = mtp_layers;
  ModelShape m{model, a.n_layers, a.dim, a.vocab_size, {}, rope_bytes(std::max(a.max_seq_len, seq_len), a.qk_rope_head_dim)};
  auto& p = m.params;
  p.push_back({"tok_embeddings.weight", Shape{a.vocab_size, a.dim}, PlannedParam::kEmbedding, 0});
  for (int l = 0; l < a.n_layers; ++l) deepseek_block(a, l, moe_tp_gather, {p, "layers." + std::to_string(l) + ".", l});
  Builder head{p, "", PlannedParam::kHead};
  head.norm("norm", a.dim);
  head.linear("output", a.dim, a.vocab_size, 0);
  for (int d = 0; d < mtp_layers; ++d) {
    Builder mtp{p, "mtp." + std::to_string(d) + ".", PlannedParam::kMtp};
    mtp.norm("enorm", a.dim);
    mtp.norm("hnorm", a.dim);
    mtp.linear("eh_proj", 2 * a.dim, a.dim, -1);
    deepseek_block(a, a.n_layers + d, moe_tp_gather, mtp.at("block"));
    mtp.norm("norm", a.dim);
  }
  return m;
}

}  // namespace

ModelShape model_shape(const std::string& model, const std::string& flavor, int64_t vocab, int64_t seq_len,
                       int64_t mtp_layers, bool moe_tp_gather) {
  if (model == "llama3") return llama3_shape(flavor, vocab, seq_len);
  if (model == "deepseek_v3" || model == "deepseek_v32")
    return deepseek_shape(model, flavor, vocab, seq_len, mtp_layers, moe_tp_gather);
  TITAN_FAIL("model '" + model + "' has no planner shape", "use llama3, deepseek_v3 or deepseek_v32");
}

}  // namespace titan::train
