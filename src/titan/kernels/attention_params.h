// The parameters of one causal attention call (sizes and softmax scale), shared by the reference
// and the fast CPU kernels.
#pragma once

#include <cstdint>

namespace titan::kernels {

// q [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv], o [B, S, H, Dv], lse [B, H, S].
// Query head h reads kv head h / (H / Hkv) (grouped-query attention; Hkv == H is plain MHA).
// Dqk and Dv differ for MLA (192 and 128). Query i attends to keys j <= i.
struct AttentionParams {
  int64_t B = 0, S = 0, H = 0, Hkv = 0, Dqk = 0, Dv = 0;
  double scale = 0;  // softmax scale applied to q.k; callers usually pass Dqk^-0.5
};

// Attention with no mask between Sq queries and Skv other keys (ring attention's blocks that lie
// wholly before the queries): q [B, Sq, H, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv],
// o [B, Sq, H, Dv], lse [B, H, Sq]. Every query attends to every key.
struct UnmaskedAttentionParams {
  int64_t B = 0, Sq = 0, Skv = 0, H = 0, Hkv = 0, Dqk = 0, Dv = 0;
  double scale = 0;
};

}  // namespace titan::kernels
