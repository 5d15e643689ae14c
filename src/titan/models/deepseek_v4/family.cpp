// DeepSeek-V4's spec (models/family.h): flavors, build, and what the memory planner needs beyond
// the parameters. [dsa] indexer_loss_coeff weighs the CSA indexers' KL loss (0: the indexers do
// not learn, as in transformers) and [dsa] topk overrides index_topk; V4 has no dense warm-up.
#include "titan/models/deepseek_v4/family.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/models/activation_terms.h"
#include "titan/models/common.h"
#include "titan/models/deepseek_v4/model.h"

namespace titan::models::deepseek_v4 {

namespace {

DeepSeekV4Args architecture(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& o) {
  DeepSeekV4Args a = deepseek_v4_flavor(flavor, vocab);
  if (o.dsa.topk > 0) a.index_topk = o.dsa.topk;
  a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
  a.validate();
  return a;
}

std::unique_ptr<CausalLM> build(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& o) {
  const auto unsupported = [](bool on, const std::string& what, const std::string& fix) {
    TITAN_CHECK(!on, "deepseek_v4 does not run " + what + " yet", fix);
  };
  unsupported(o.tp && o.tp->size() > 1, "tensor parallel", "set parallelism.tensor_parallel_degree = 1");
  unsupported(o.ep && o.ep->size() > 1, "expert parallel", "set parallelism.expert_parallel_degree = 1");
  unsupported(o.cp && o.cp->size() > 1, "context parallel", "set parallelism.context_parallel_degree = 1");
  unsupported(!o.pipeline_stages.empty(), "pipeline parallel", "set parallelism.pipeline_parallel_degree = 1");
  TITAN_CHECK(o.dsa.warmup_steps == 0, "dsa.warmup_steps = " + std::to_string(o.dsa.warmup_steps) +
                                           ": DeepSeek-V4's indexers train beside the model from the first step",
              "remove dsa.warmup_steps (V4 has no dense warm-up stage)");
  const DeepSeekV4Args a = architecture(flavor, vocab, max_seq_len, o);
  if (max_seq_len > 0) a.validate_sequence(max_seq_len);
  auto m = build_placed([&] { return std::make_unique<Transformer>(a); });
  m->set_indexer_loss_coeff(o.dsa.indexer_loss_coeff);
  return m;
}

int64_t n_layers(const std::string& flavor, int64_t vocab, const ModelOptions&) {
  return deepseek_v4_flavor(flavor, vocab).n_layers;
}

// models/deepseek_v4/model.cpp's layer, f32: the streams into and between its two blocks, each
// hyper-connection's mixes and the collapsed input; the attention's query latent, queries (normed,
// roped), key = value row, output (and turned back), grouped projection and its compressor's
// projections and entries; the MoE's routed rows (K per token: w1, w3, product, w2 output) and the
// shared expert's. An approximation the planner's measured test does not check for V4 yet.
ActivationModel activations(const PlanQuery& j) {
  const DeepSeekV4Args a = deepseek_v4_flavor(j.flavor, j.vocab);
  const double c = 4, d = double(a.dim), n = double(a.hc_mult), hd = double(a.head_dim), h = double(a.n_heads);
  const double f = double(a.moe_inter_dim), k = double(a.n_activated_experts);
  ActivationModel m;
  for (LayerType t : a.layer_types) {
    BlockTensors x;
    x.add(2 * n * d * c, true, true);                         // the streams into each block
    x.add(2 * ((n + 2) * n + d + 2 * d) * c, true);           // mixes, collapsed, normed (per block)
    x.add((double(a.q_lora_rank) * 2 + 3 * h * hd + 2 * hd) * c, true, true);  // qr, q, kv, o
    x.add((double(a.o_groups * a.o_lora_rank) + d) * c, true, true);          // grouped, output
    const int64_t m_ratio = a.compress_ratio(t);
    if (m_ratio > 0) x.add((t == LayerType::csa ? 4 : 2) * hd * c + hd / double(m_ratio) * c, true);
    x.add((k + 1) * 4 * f * c + 2 * d * c, true, true);       // experts' rows, routed output
    m.blocks.push_back(block_activations(x, n * d * c, 0, 0, (k + 1) * 3 * f * c + 2 * n * d * c));
  }
  m.embedding = n * d * c;
  m.head = (2 * d + double(a.vocab_size)) * c;
  m.head_backward = (double(a.vocab_size) + 2 * d) * c;
  return m;
}

std::vector<int64_t> experts_per_token(const PlanQuery& j) {
  const DeepSeekV4Args a = deepseek_v4_flavor(j.flavor, j.vocab);
  return std::vector<int64_t>(size_t(a.n_layers), a.n_activated_experts);
}

std::vector<ContextParallelTraffic> context_parallel_traffic(const PlanQuery&) { return {}; }

}  // namespace

const ModelFamily& family() {
  static const ModelFamily f{
      .name = "deepseek_v4",
      .flavors = deepseek_v4_flavor_names,
      .routed_experts = true,
      .multi_token_prediction = false,
      .sparse_attention = true,
      .tensor_parallel = false,
      .converters = {},
      .build = build,
      .n_layers = n_layers,
      .activations = activations,
      .experts_per_token = experts_per_token,
      .context_parallel_traffic = context_parallel_traffic,
  };
  return f;
}

}  // namespace titan::models::deepseek_v4
