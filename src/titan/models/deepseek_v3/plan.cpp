// What the memory planner needs of a DeepSeek-V3 / V3.2 flavor beyond its parameters: the
// activations each block keeps (mla.cpp, dsa_fused.cpp, indexer.cpp, models/moe), the tokens
// its MoE layers route and context parallelism's exchange.
#include "titan/models/deepseek_v3/plan.h"

#include <algorithm>

#include "titan/models/activation_terms.h"

namespace titan::models::deepseek_v3 {

namespace {

// One DeepSeek block (models/deepseek_v3: mla.cpp, dsa_fused.cpp, indexer.cpp, models/moe), the
// DSA sparse stage with the fused kernels or plain MLA. Under TP the residual stream and the
// routed tokens are the rank's 1/tp, the norms' outputs and MLA's replicated down-projections and
// indexer cover every token, the per-head tensors hold the rank's heads; under DSA context
// parallelism the gathered latent KV and indexer keys of the whole sequence are kept too.
BlockActivations block(const DeepSeekV3Args& a, const PlanQuery& j, bool moe) {
  const double c = j.bf16 ? 2 : 4, f32 = 4, t = j.tp;
  const double D = double(a.dim), H = double(a.n_heads) / t, dc = double(a.kv_lora_rank), dr = double(a.qk_rope_head_dim);
  const double dn = double(a.qk_nope_head_dim), dv = double(a.v_head_dim), ql = double(a.q_lora_rank);
  BlockTensors x;
  x.add(D / t * c, true);          // block input (attention_norm's)
  x.add(1 * f32 / t, true);        // its rstd
  x.add(D * c, true);              // attention_norm output (gathered)
  if (a.has_indexer()) {
    const double K = double(std::min(j.topk > 0 ? j.topk : a.index_topk, j.seq_len));
    const double HI = double(a.index_n_heads), DI = double(a.index_head_dim);
    x.add(ql * c, true, true);             // wq_a output
    x.add(f32, true);                      // q_norm rstd
    x.add(ql * c, true);                   // q_norm output
    x.add((dc + dr) * c, false, true);     // wkv_a output
    x.add(dc * c, true);                   // the latent before kv_norm
    x.add(f32, true);                      // kv_norm rstd
    x.add(H * (dn + dr) * c, false, true); // wq_b output
    x.add(H * (dn + dr) * c, true);        // q after RoPE
    x.add((dc + dr) * c * j.cp, true);     // kv = [latent | k_rope] (under CP, every rank's)
    x.add(H * (dc + dr) * c, true);        // absorbed q
    x.add(K * 4, true);                    // top-k indices (i32)
    x.add(H * dc * c, true);               // latent attention output
    x.add(H * f32, true);                  // its log-sum-exp
    x.add(H * dv * c, true);               // unabsorbed output (wo's input)
    x.add(HI * DI * c, false, true);       // indexer wq_b output
    x.add(DI * c, true, true);             // indexer wk output
    x.add(DI * c * (j.cp - 1), true);      // under CP, the other ranks' indexer keys
    x.add(2 * f32, true);                  // its LayerNorm mean, rstd
    x.add(HI * c, false, true);            // weights_proj output
    x.add((HI * DI + DI) * c, true);       // the KL loss's precomputed dq, dk
    x.add(HI * f32, true);                 // ... and dw
  } else {
    if (ql > 0) {
      x.add(ql * c, true, true);
      x.add(f32, true);
      x.add(ql * c, true);
    }
    x.add(H * (dn + dr) * c, false, true);  // wq / wq_b output
    x.add(H * (dn + dr) * c, true);         // q after RoPE
    x.add((dc + dr) * c, false, true);      // wkv_a output
    x.add(dc * c, true);                    // latent before kv_norm
    x.add(f32, true);                       // kv_norm rstd
    x.add(dc * c, true);                    // kv_norm output
    if (!j.bf16) {
      x.add(H * (dn + dv) * c, true, true);  // wkv_b output
      x.add(dr * c, true);                   // k_rope
    } else {
      x.add(H * (dn + dv) * c, false, true);  // wkv_b output
      x.add(H * (dn + dr) * c, true);         // keys
      x.add(H * dv * c, true);                // values
    }
    x.add(H * dv * c, true, true);  // attention output
    x.add(H * f32, true, true);     // its log-sum-exp
  }
  x.add(D / t * c, false, true);  // wo output
  x.add(D / t * c, true);         // h = x + attention
  x.add(f32 / t, true);           // ffn_norm rstd
  x.add(D * c, true);             // ffn_norm output (gathered)
  double replay = 0;              // alive at a replayed block's peak, beyond what it holds
  double backward = 0;
  if (moe) {
    // The MoE TP fix: each TP rank routes its own tokens (1/tp of them) through whole experts;
    // TorchTitan's scheme: every rank routes every token through its 1/tp of each expert's hidden
    // units. The shared experts run tensor-parallel either way.
    const double k = double(a.n_activated_experts), E = double(a.n_routed_experts);
    const double share = j.moe_tp_gather ? 1 : 1 / t, F = double(a.moe_inter_dim) / (j.moe_tp_gather ? t : 1);
    const double Fs = double(a.n_shared_experts * a.moe_inter_dim) / t;
    if (j.bf16) x.add(D * f32 * share, true);           // the router's f32 input
    x.add(((E + k) * f32 + 2 * k * 4) * share, true);   // scores, gate weights; top-k ids, positions (i32)
    x.add(k * D * c * share, true);                     // tokens sorted by expert
    x.add(3 * k * F * c * share, true);                 // w1, w3 outputs and their SwiGLU product
    x.add(k * D * c * share, true);                     // expert outputs
    x.add(2 * Fs * c, true, true);                      // shared experts' w1, w3 outputs
    x.add(Fs * c, true);                                // their SwiGLU product
    x.add(D / t * c, false, true);                      // shared experts' w2 output
    replay = 2 * D / t * c;                             // the routed output and the MoE's sum
    backward = ((3 * D + k * (2 * D + 3 * F)) * c + 4 * k) * share;
  } else {
    const double I = double(a.inter_dim) / t;
    x.add(2 * I * c, true, true);  // w1, w3 outputs
    x.add(I * c, true);            // SwiGLU product
    x.add(D / t * c, false, true); // w2 output
    replay = D / t * c;            // the block's output
    backward = (3 * I + D / t) * c;  // and the residual stream's gradient
  }
  if (a.has_indexer()) {
    // The sparse attention's backward: dq, the latent output's gradient, dkv, the indexer's
    // q / k / w gradients and the residual's.
    const double HI = double(a.index_n_heads), DI = double(a.index_head_dim);
    backward = std::max(backward, (H * (dc + dr) + H * dc + (dc + dr) + HI * DI + DI + D) * c + 4 * HI);
  }
  // Full checkpointing: the replay also holds the FFN's last output (selective keeps it).
  return block_activations(x, D / t * c, replay + D / t * c, replay, backward);
}

}  // namespace

ActivationModel activation_model(const DeepSeekV3Args& a, const PlanQuery& j) {
  const double c = j.bf16 ? 2 : 4, t = j.tp;
  ActivationModel m;
  for (int64_t l = 0; l < a.n_layers + j.mtp_layers; ++l) m.blocks.push_back(block(a, j, a.is_moe_layer(l)));
  const double D = double(a.dim), V = double(a.vocab_size);
  m.head = (2 * D / t + V / t) * c + 3 * 4;  // last block output, final norm output, logits; rstd, lse, loss
  m.head_backward = (V / t + 2 * D / t) * c;
  return m;
}

std::vector<int64_t> experts_per_token(const DeepSeekV3Args& a, const PlanQuery& j) {
  std::vector<int64_t> k;
  for (int64_t l = 0; l < a.n_layers + j.mtp_layers; ++l) k.push_back(a.is_moe_layer(l) ? a.n_activated_experts : 0);
  return k;
}

// DSA's scheme: the latent KV and indexer keys all-gathered along the sequence (in the compute
// dtype), their f32 gradients reduce-scattered back.
std::vector<ContextParallelTraffic> context_parallel_traffic(const DeepSeekV3Args& a, const PlanQuery& j) {
  const double rows = double(a.kv_lora_rank + a.qk_rope_head_dim + (a.has_indexer() ? a.index_head_dim : 0));
  return {{"all_gather", rows * (j.bf16 ? 2 : 4), "latent KV and indexer keys along the sequence"},
          {"reduce_scatter", rows * 4, "their gradients back"}};
}

}  // namespace titan::models::deepseek_v3
