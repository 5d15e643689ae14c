#include <algorithm>

#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/llama3/model.h"
#include "titan/models/moe/moe.h"

namespace titan::models {

// DeepSeek-V3's MoE layers: routed + shared SwiGLU experts from models/moe, sized by the flavor.
namespace {
moe::MoEArgs moe_args(const deepseek_v3::DeepSeekV3Args& a, const distributed::ProcessGroup* tp, bool tp_gather,
                      const distributed::ProcessGroup* ep = nullptr) {
  moe::MoEArgs m;
  m.dim = a.dim;
  m.moe_inter_dim = a.moe_inter_dim;
  m.n_routed_experts = a.n_routed_experts;
  m.n_shared_experts = a.n_shared_experts;
  m.n_activated_experts = a.n_activated_experts;
  m.score_func = a.score_func == deepseek_v3::ScoreFunc::sigmoid ? kernels::RouterScore::sigmoid
                                                                 : kernels::RouterScore::softmax;
  m.route_norm = a.route_norm;
  m.route_scale = a.route_scale;
  m.n_expert_groups = a.n_expert_groups;
  m.n_limited_groups = a.n_limited_groups;
  m.load_balance_coeff = a.load_balance_coeff;
  m.aux_loss_alpha = a.aux_loss_alpha;
  m.tp = tp;
  m.tp_gather = tp_gather;
  m.ep = ep;
  return m;
}
}  // namespace

std::unique_ptr<BlockFeedForward> deepseek_v3::moe_layer(const deepseek_v3::DeepSeekV3Args& a, int layer_id,
                                                         const distributed::ProcessGroup* tp) {
  return std::make_unique<moe::MoE>(moe_args(a, tp, false), a.out_proj_std(layer_id));
}

std::unique_ptr<BlockFeedForward> deepseek_v3::moe_layer_tp_gather(const deepseek_v3::DeepSeekV3Args& a, int layer_id,
                                                                   const distributed::ProcessGroup* tp) {
  return std::make_unique<moe::MoE>(moe_args(a, tp, true), a.out_proj_std(layer_id));
}

namespace {

// The MoE layers of the options' tensor-parallel scheme, their routed experts over the options'
// expert-parallel group.
deepseek_v3::MoeFactory moe_factory(const ModelOptions& options) {
  if (options.ep && options.ep->size() > 1)
    return [ep = options.ep, gather = options.moe_tp_gather](const deepseek_v3::DeepSeekV3Args& a, int layer_id,
                                                              const distributed::ProcessGroup* tp) {
      return std::unique_ptr<BlockFeedForward>(
          std::make_unique<moe::MoE>(moe_args(a, tp, gather, ep), a.out_proj_std(layer_id)));
    };
  return options.moe_tp_gather ? deepseek_v3::MoeFactory(deepseek_v3::moe_layer_tp_gather)
                               : deepseek_v3::MoeFactory(deepseek_v3::moe_layer);
}

// Only DeepSeek-V3.2 has converters and a [dsa] schedule: any other model refuses them.
void refuse_dsa_options(const std::string& name, const ModelOptions& options) {
  TITAN_CHECK(options.converters.empty(), "model.converters " + options.converters.front() + " is not known to model " + name,
              "remove model.converters (only deepseek_v32 has one: dsa_fused)");
  TITAN_CHECK(options.dsa == DsaSchedule{}, "the [dsa] section is set, but model " + name +
                                                " has no DeepSeek Sparse Attention",
              "remove the [dsa] keys, or train model.name = \"deepseek_v32\"");
}

// DeepSeek-V3.2 trains on the [dsa] schedule with the converters' kernels.
std::unique_ptr<CausalLM> with_training_options(std::unique_ptr<deepseek_v3::Transformer> m, const std::string& name,
                                                const ModelOptions& options) {
  const deepseek_v3::DeepSeekV3Args& a = m->args();
  TITAN_CHECK(!options.ep || options.ep->size() == 1 || a.n_dense_layers < a.n_layers + a.num_mtp_layers,
              "parallelism.expert_parallel_degree = " + std::to_string(options.ep ? options.ep->size() : 1) +
                  ": this " + name + " architecture has no MoE layer (n_dense_layers = " + std::to_string(a.n_dense_layers) + ")",
              "set expert_parallel_degree = 1");
  if (a.has_indexer()) m->set_dsa_schedule(options.dsa, deepseek_v3::dsa_impl_from_converters(options.converters));
  else refuse_dsa_options(name, options);
  m->set_context_parallel(options.cp);
  m->set_async_tensor_parallel(options.async_tp);
  return m;
}

}  // namespace

std::unique_ptr<CausalLM> build_model(const std::string& name, const std::string& flavor, int64_t vocab_size,
                                      int64_t max_seq_len, const ModelOptions& options) {
  TITAN_CHECK(options.mtp_layers == 0 || name == "deepseek_v3",
              "model.mtp_layers = " + std::to_string(options.mtp_layers) + ": model '" + name +
                  "' has no multi-token prediction",
              "set model.mtp_layers = 0 (only deepseek_v3 has MTP modules)");
  if (name == "llama3") {
    refuse_dsa_options(name, options);
    TITAN_CHECK(!options.ep || options.ep->size() == 1,
                "parallelism.expert_parallel_degree = " + std::to_string(options.ep ? options.ep->size() : 1) +
                    ": llama3 has no experts to divide",
                "set expert_parallel_degree = 1 (expert parallelism splits deepseek_v3 / deepseek_v32's routed experts)");
    llama3::Llama3Args a = llama3::llama3_flavor(flavor, vocab_size);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
    auto m = std::make_unique<llama3::Transformer>(a, options.tp, options.pipeline_stages);
    m->set_context_parallel(options.cp);
    m->set_async_tensor_parallel(options.async_tp);
    return m;
  }
  const bool deepseek = name == "deepseek_v3" || name == "deepseek_v32";
  TITAN_CHECK(!options.hf_config || deepseek, "a Hugging Face architecture was given for model '" + name + "'",
              "only DeepSeek checkpoints convert from Hugging Face; set [model] name = \"deepseek_v3\" or "
              "\"deepseek_v32\"");
  if (deepseek && options.hf_config) {
    deepseek_v3::DeepSeekV3Args a = deepseek_v3::args_from_hf_config(*options.hf_config, "the checkpoint's hf_config");
    TITAN_CHECK(a.vocab_size >= vocab_size, "the Hugging Face model has " + std::to_string(a.vocab_size) +
                                                " token embeddings but the tokenizer has " + std::to_string(vocab_size) + " tokens",
                "prepare the dataset with the tokenizer that came with the model");
    a.num_mtp_layers = options.mtp_layers;  // the config's MTP modules train only when asked for
    a.mtp_loss_weight = options.mtp_loss_weight;
    a.n_dense_layers = std::min(a.n_dense_layers, a.n_layers + a.num_mtp_layers);
    a.load_balance_coeff = options.moe_load_balance_coeff;
    a.aux_loss_alpha = options.moe_aux_loss_alpha;
    a.validate();
    return with_training_options(std::make_unique<deepseek_v3::Transformer>(a, moe_factory(options), options.tp, options.pipeline_stages), name, options);
  }
  if (name == "deepseek_v3") {
    deepseek_v3::DeepSeekV3Args a = deepseek_v3::deepseek_v3_flavor(flavor, vocab_size);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
    a.num_mtp_layers = options.mtp_layers;
    a.mtp_loss_weight = options.mtp_loss_weight;
    a.load_balance_coeff = options.moe_load_balance_coeff;
    a.aux_loss_alpha = options.moe_aux_loss_alpha;
    a.validate();
    return with_training_options(std::make_unique<deepseek_v3::Transformer>(a, moe_factory(options), options.tp, options.pipeline_stages), name, options);
  }
  if (name == "deepseek_v32") {
    deepseek_v3::DeepSeekV3Args a = deepseek_v3::deepseek_v32_flavor(flavor, vocab_size);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
    a.load_balance_coeff = options.moe_load_balance_coeff;
    a.aux_loss_alpha = options.moe_aux_loss_alpha;
    return with_training_options(std::make_unique<deepseek_v3::Transformer>(a, moe_factory(options), options.tp, options.pipeline_stages), name, options);
  }
  std::string names;
  for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  TITAN_FAIL("model '" + name + "' is not implemented in this build", "set [model] name to one of: " + names);
}

std::vector<std::string> model_names() { return {"llama3", "deepseek_v3", "deepseek_v32"}; }

int64_t model_layers(const std::string& name, const std::string& flavor, int64_t vocab_size,
                     const ModelOptions& options) {
  if (name == "llama3") return llama3::llama3_flavor(flavor, vocab_size).n_layers;
  if ((name == "deepseek_v3" || name == "deepseek_v32") && options.hf_config)
    return deepseek_v3::args_from_hf_config(*options.hf_config, "the checkpoint's hf_config").n_layers;
  if (name == "deepseek_v3") return deepseek_v3::deepseek_v3_flavor(flavor, vocab_size).n_layers;
  if (name == "deepseek_v32") return deepseek_v3::deepseek_v32_flavor(flavor, vocab_size).n_layers;
  TITAN_FAIL("model '" + name + "' is not implemented in this build");
}

}  // namespace titan::models
