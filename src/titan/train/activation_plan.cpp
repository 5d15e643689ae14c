#include "titan/train/activation_plan.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/llama3/args.h"

namespace titan::train {

namespace {

// Tensors of one block, each as (bytes per token, kept without checkpointing, kept by selective).
struct Tensors {
  double held = 0, saved = 0, held_or_saved = 0;
  void add(double bytes, bool held_, bool saved_ = false) {
    if (held_) held += bytes;
    if (saved_) saved += bytes;
    if (held_ || saved_) held_or_saved += bytes;
  }
};

BlockActivations block_of(const Tensors& t, double input, double replay_extra_full, double replay_extra_selective,
                          double backward) {
  BlockActivations b;
  b.held = t.held;
  b.kept_full = input;
  b.kept_selective = input + t.saved;
  b.replay_full = t.held + replay_extra_full;
  b.replay_selective = t.held_or_saved + replay_extra_selective;
  b.backward = backward;
  return b;
}

// Llama-3 (models/llama3/model.cpp): the block's input and mid-block residual, both norms'
// outputs (under TP gathered to every token), q and k after RoPE and v, the attention output,
// the FFN's up-projections and the SwiGLU product; under sequence parallelism the residuals are
// the rank's tokens and the head-sharded tensors 1/tp wide. Selective keeps the GEMM and
// attention outputs (q, k, v before RoPE, the attention output, the up-projections).
ActivationModel llama3_model(const ActivationJob& j) {
  const auto a = models::llama3::llama3_flavor(j.flavor, j.vocab);
  const double c = j.bf16 ? 2 : 4, t = j.tp;
  const double d = double(a.dim), q = double(a.n_heads * a.head_dim()), kv = double(a.kv_heads() * a.head_dim());
  const double f = double(a.ffn_hidden()), v = double(a.vocab_size);
  Tensors x;
  x.add(2 * d / t * c, true, true);        // block input, mid-block residual
  x.add(2 * d * c, true);                  // the norms' outputs, gathered
  x.add((q + 2 * kv) / t * c, true, true); // q, k (roped; selective keeps them before RoPE), v
  x.add(q / t * c, true, true);            // attention output
  x.add(2 * f / t * c, true, true);        // w1, w3 outputs
  x.add(f / t * c, true);                  // SwiGLU product
  // Backward: the FFN's activation gradients and the residual stream's; under CP ring attention's
  // K/V buffers (arriving, next, and dK/dV travelling home).
  const double backward = (3 * f + d) / t * c + (j.cp > 1 ? 3 * 2 * kv / t * c : 0);
  const BlockActivations b = block_of(x, d / t * c, 0, 0, backward);
  ActivationModel m;
  m.blocks.assign(size_t(a.n_layers), b);
  m.embedding = d / t * c;
  m.head = (d + v / t) * c;
  m.head_backward = (v / t + 2 * d / t) * c;
  return m;
}

// One DeepSeek block (models/deepseek_v3: mla.cpp, dsa_fused.cpp, indexer.cpp, models/moe), the
// DSA sparse stage with the fused kernels or plain MLA. Under TP the residual stream and the
// routed tokens are the rank's 1/tp, the norms' outputs and MLA's replicated down-projections and
// indexer cover every token, the per-head tensors hold the rank's heads; under DSA context
// parallelism the gathered latent KV and indexer keys of the whole sequence are kept too.
BlockActivations deepseek_block(const models::deepseek_v3::DeepSeekV3Args& a, const ActivationJob& j, bool moe) {
  const double c = j.bf16 ? 2 : 4, f32 = 4, t = j.tp;
  const double D = double(a.dim), H = double(a.n_heads) / t, dc = double(a.kv_lora_rank), dr = double(a.qk_rope_head_dim);
  const double dn = double(a.qk_nope_head_dim), dv = double(a.v_head_dim), ql = double(a.q_lora_rank);
  Tensors x;
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
  return block_of(x, D / t * c, replay + D / t * c, replay, backward);
}

ActivationModel deepseek_model(const ActivationJob& j) {
  namespace ds = models::deepseek_v3;
  const ds::DeepSeekV3Args a = ds::deepseek_flavor(j.model, j.flavor, j.vocab);
  const double c = j.bf16 ? 2 : 4, t = j.tp;
  ActivationModel m;
  for (int64_t l = 0; l < a.n_layers + j.mtp_layers; ++l) m.blocks.push_back(deepseek_block(a, j, a.is_moe_layer(l)));
  const double D = double(a.dim), V = double(a.vocab_size);
  m.head = (2 * D / t + V / t) * c + 3 * 4;  // last block output, final norm output, logits; rstd, lse, loss
  m.head_backward = (V / t + 2 * D / t) * c;
  return m;
}

}  // namespace

ActivationModel activation_model(const ActivationJob& j) {
  ActivationModel m;
  if (j.model == "llama3") m = llama3_model(j);
  else if (j.model == "deepseek_v3" || j.model == "deepseek_v32") m = deepseek_model(j);
  else TITAN_FAIL("model '" + j.model + "' has no activation plan", "use llama3, deepseek_v3 or deepseek_v32");
  m.io = 3 * 4;  // inputs, targets and positions (i32)
  return m;
}

double activation_peak(const ActivationModel& m, const std::vector<int>& blocks, bool embedding, bool head,
                       models::Recompute mode) {
  double kept = m.io + (embedding ? m.embedding : 0), replay = 0;
  for (const int id : blocks) {
    const BlockActivations& b = m.blocks.at(size_t(id));
    switch (mode) {
      case models::Recompute::none: kept += b.held; break;
      case models::Recompute::full:
        kept += b.kept_full;
        replay = std::max(replay, b.replay_full - b.kept_full);
        break;
      case models::Recompute::selective:
        kept += b.kept_selective;
        replay = std::max(replay, b.replay_selective - b.kept_selective);
        break;
    }
  }
  return kept + std::max(head ? m.head : 0.0, replay);
}

double backward_temporaries(const ActivationModel& m, const std::vector<int>& blocks, bool head,
                            models::Recompute mode) {
  double most = head ? m.head_backward : 0;
  for (const int id : blocks) {
    const BlockActivations& b = m.blocks.at(size_t(id));
    // A replayed block's output gradient is copied into the replay (autograd/variable.cpp).
    most = std::max(most, b.backward + (mode == models::Recompute::none ? 0 : b.kept_full));
  }
  return most;
}

}  // namespace titan::train
