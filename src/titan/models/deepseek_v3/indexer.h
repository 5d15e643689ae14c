// The lightning indexer of one DeepSeek-V3.2 layer (docs/dsa.md section 2): per token, H_I query heads
// from the query latent qr and one key from the hidden state x, scored by
//   I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s]).
// Registered as "attention.indexer" with TorchTitan/DeepSeek names: wq_b, wk, k_norm, weights_proj.
#pragma once

#include "titan/models/converters.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v3/dsa.h"
#include "titan/nn/layers.h"

namespace titan::models::deepseek_v3 {

class Indexer : public nn::Module, public AppliesRope {
 public:
  explicit Indexer(const DeepSeekV3Args& a);

  struct Outputs {
    Variable q;  // [B, S, HI, DI]
    Variable k;  // [B, S, DI]
    Variable w;  // [B, S, HI] f32
  };
  // x [B, S, D] (the attention's normed input) and qr [B, S, q_lora_rank] (q_norm(wq_a x)). The
  // caller detaches both: the indexer learns only from its own loss. RoPE (rotate-half, MLA's
  // YaRN tables, no mscale) turns the FIRST qk_rope_head_dim dims of q and k; then the optional
  // Hadamard rotation, through `impl`'s op.
  Outputs forward(const Variable& x, const Variable& qr, const kernels::RopeTables& rope, const Tensor& positions,
                  DsaImpl impl) const;

  nn::Linear &wq_b, &wk;
  nn::LayerNorm& k_norm;
  nn::Linear& weights_proj;

 private:
  int64_t n_heads_, head_dim_;
  bool hadamard_;
};

}  // namespace titan::models::deepseek_v3
