// Ring attention: context parallelism for dense causal attention (llama3, DeepSeek's dense MLA).
// Each rank holds two head-tail chunks of every sequence (context_parallel.h: rank r holds chunks
// r and 2c-1-r, C = S/2c positions each). Its keys and values go once around the cp ring; at step
// s rank r holds those of rank t = r - s (mod c) and attends where causality allows:
//   s = 0:  its own keys, the causal kernel over its two chunks in local order (early, late);
//   t < r:  chunk t precedes both local chunks and chunk 2c-1-t follows both: every local query
//           attends to t's early chunk, with no mask;
//   t > r:  both of t's chunks lie between the local ones: the late local queries attend to both.
// Every step is 2C x C query-key pairs, so the ranks stay balanced. Partial outputs merge by
// log-sum-exp (kernels/attention_unmasked.h). The next block's send and receive run while the
// current one computes.
// Backward: the keys and values go around again while each rank adds its share of their
// gradients into an f32 buffer that travels with them; after c - 1 hops that buffer arrives home
// and joins the owner's own gradient. Gradients sum in f32 and round to the activation dtype once.
// Per rank and call, with n = this rank's key and value elements: forward (c-1) n bytes of the
// activation dtype, backward as much again plus (c-1) n x 4 bytes of gradients.
#pragma once

#include <optional>

#include "titan/autograd/variable.h"
#include "titan/distributed/process_group.h"

namespace titan::distributed {

// q [B, L, H, Dqk], k [B, L, Hkv, Dqk], v [B, L, Hkv, Dv] hold this rank's two chunks (L = 2C, in
// local order) -> o [B, L, H, Dv]: causal attention of the local queries over the whole sequence.
// scale defaults to Dqk^-0.5. On a group of one rank it is the causal kernel.
autograd::Variable ring_attention(const autograd::Variable& q, const autograd::Variable& k,
                                  const autograd::Variable& v, const ProcessGroup& cp,
                                  std::optional<double> scale = std::nullopt);

// Bytes one rank sends for one call of ring_attention on its k and v (kv_elements in all, of
// `dtype`), forward and backward, for comparing measured traffic with the schedule.
struct RingTraffic {
  double forward = 0, backward = 0;
};
RingTraffic ring_attention_traffic(int64_t kv_elements, DType dtype, int degree);

}  // namespace titan::distributed
