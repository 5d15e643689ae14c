// Llama-3's spec (models/family.h): flavors, build, and what the memory planner needs beyond
// its parameters.
#include "titan/models/llama3/family.h"

#include <algorithm>

#include "titan/models/activation_terms.h"
#include "titan/models/common.h"
#include "titan/models/converters.h"
#include "titan/models/llama3/model.h"

namespace titan::models::llama3 {

namespace {

std::unique_ptr<CausalLM> build(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& options) {
  Llama3Args a = llama3_flavor(flavor, vocab);
  a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
  auto m = build_placed([&] { return std::make_unique<Transformer>(a, options.tp, options.pipeline_stages); });
  m->set_context_parallel(options.cp);
  m->set_async_tensor_parallel(options.async_tp);
  return m;
}

int64_t n_layers(const std::string& flavor, int64_t vocab, const ModelOptions&) {
  return llama3_flavor(flavor, vocab).n_layers;
}

// models/llama3/model.cpp's block: its input and mid-block residual, both norms' outputs (under
// TP gathered to every token), q and k after RoPE and v, the attention output, the FFN's
// up-projections and the SwiGLU product; under sequence parallelism the residuals are the rank's
// tokens and the head-sharded tensors 1/tp wide. Selective keeps the GEMM and attention outputs
// (q, k, v before RoPE, the attention output, the up-projections).
ActivationModel activations(const PlanQuery& j) {
  const Llama3Args a = llama3_flavor(j.flavor, j.vocab);
  const double c = j.bf16 ? 2 : 4, t = j.tp;
  const double d = double(a.dim), q = double(a.n_heads * a.head_dim()), kv = double(a.kv_heads() * a.head_dim());
  const double f = double(a.ffn_hidden()), v = double(a.vocab_size);
  BlockTensors x;
  x.add(2 * d / t * c, true, true);         // block input, mid-block residual
  x.add(2 * d * c, true);                   // the norms' outputs, gathered
  x.add((q + 2 * kv) / t * c, true, true);  // q, k (roped; selective keeps them before RoPE), v
  x.add(q / t * c, true, true);             // attention output
  x.add(2 * f / t * c, true, true);         // w1, w3 outputs
  x.add(f / t * c, true);                   // SwiGLU product
  // Backward: the FFN's activation gradients and the residual stream's; under CP ring attention's
  // K/V buffers (arriving, next, and dK/dV travelling home).
  const double backward = (3 * f + d) / t * c + (j.cp > 1 ? 3 * 2 * kv / t * c : 0);
  ActivationModel m;
  m.blocks.assign(size_t(a.n_layers), block_activations(x, d / t * c, 0, 0, backward));
  m.embedding = d / t * c;
  m.head = (d + v / t) * c;
  m.head_backward = (v / t + 2 * d / t) * c;
  return m;
}

// Ring attention passes K/V around, and K/V again plus dK/dV in backward.
std::vector<ContextParallelTraffic> context_parallel_traffic(const PlanQuery& j) {
  const Llama3Args a = llama3_flavor(j.flavor, j.vocab);
  const double kv = 2.0 * double(a.kv_heads() * a.head_dim()) / j.tp * (j.bf16 ? 2 : 4);
  return {{"send", 3 * kv, "ring attention: K/V forward, K/V and dK/dV backward"}};
}

}  // namespace

const ModelFamily& family() {
  static const ModelFamily f{
      .name = "llama3",
      .flavors = llama3_flavor_names,
      .fp16 = true,
      .converters = {kConverterRmsNorm, kConverterRope},
      .build = build,
      .n_layers = n_layers,
      .activations = activations,
      .experts_per_token = nullptr,
      .context_parallel_traffic = context_parallel_traffic,
  };
  return f;
}

}  // namespace titan::models::llama3
