#include "titan/train/param_inventory.h"

#include "titan/core/allocator.h"
#include "titan/nn/module.h"
#include "titan/optim/param_groups.h"

namespace titan::train {

namespace {

// The block a parameter belongs to, from the names every model gives its parts (causal_lm.h):
// the embedding, layers.<id>, mtp.<k>; the rest (final norm, output head) is the head's.
int block_of(const std::string& name) {
  if (models::is_embedding_parameter(name)) return PlannedParam::kEmbedding;
  if (name.starts_with("mtp.")) return PlannedParam::kMtp;
  if (name.starts_with("layers.")) return std::stoi(name.substr(7));
  return PlannedParam::kHead;
}

}  // namespace

ModelShape model_shape(const std::string& model, const std::string& flavor, int64_t vocab, int64_t seq_len,
                       int64_t mtp_layers, bool moe_tp_gather) {
  const models::ModelFamily& family = models::model_family(model);
  models::ModelOptions options;
  options.mtp_layers = mtp_layers;
  options.moe_tp_gather = moe_tp_gather;
  const auto parameter_bytes = [] { return memory_stats().live[size_t(MemCategory::parameters)]; };
  const int64_t before = parameter_bytes();
  std::unique_ptr<models::CausalLM> built;
  {
    nn::ParametersWithoutStorage no_storage;
    built = family.build(flavor, vocab, seq_len, options);
  }
  ModelShape m;
  m.family = &family;
  m.buffer_bytes = double(parameter_bytes() - before);
  m.n_layers = family.n_layers(flavor, vocab, options);
  // One token's residual between stages: [.., dim], or [1, streams, dim].
  const Shape residual = built->stage_activation_shape(1, 1);
  m.dim = residual[residual.size() - 1];
  m.stage_width = residual.numel();
  m.vocab = built->vocab_size();
  for (const auto& [name, p] : built->named_parameters())
    m.params.push_back({name, p->var.shape(), block_of(name), p->tp_plan.dim, p->tp_plan.partial_grad, p->routed_expert,
                        p->gemm_weight, optim::muon_param_group(*p) == optim::ParamGroup::muon});
  return m;
}

}  // namespace titan::train
