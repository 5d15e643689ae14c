// DeepSeek-V3 / V3.2's specs (models/family.h): flavors, build with the MoE layer of the
// options' parallel scheme and V3.2's sparse-attention schedule, the planner's questions
// (plan.cpp) and the Hugging Face conversion (hf_adapter.cpp).
#include "titan/models/deepseek_v3/family.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/models/common.h"
#include "titan/models/converters.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/deepseek_v3/plan.h"
#include "titan/models/moe/moe.h"

namespace titan::models::deepseek_v3 {

namespace {

// Routed + shared SwiGLU experts from models/moe, sized by the flavor.
moe::MoEArgs moe_args(const DeepSeekV3Args& a, const distributed::ProcessGroup* tp, bool tp_gather,
                      const distributed::ProcessGroup* ep = nullptr) {
  moe::MoEArgs m;
  m.dim = a.dim;
  m.moe_inter_dim = a.moe_inter_dim;
  m.n_routed_experts = a.n_routed_experts;
  m.n_shared_experts = a.n_shared_experts;
  m.n_activated_experts = a.n_activated_experts;
  m.score_func = a.score_func == ScoreFunc::sigmoid ? kernels::RouterScore::sigmoid : kernels::RouterScore::softmax;
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

// The MoE layers of the options' tensor-parallel scheme, their routed experts over the options'
// expert-parallel group.
MoeFactory moe_factory(const ModelOptions& options) {
  if (options.ep && options.ep->size() > 1)
    return [ep = options.ep, gather = options.moe_tp_gather](const DeepSeekV3Args& a, int layer_id,
                                                              const distributed::ProcessGroup* tp) {
      return std::unique_ptr<BlockFeedForward>(std::make_unique<moe::MoE>(moe_args(a, tp, gather, ep), a.out_proj_std(layer_id)));
    };
  return options.moe_tp_gather ? MoeFactory(moe_layer_tp_gather) : MoeFactory(moe_layer);
}

// The architecture a build uses: the checkpoint's Hugging Face config when it has one, else the
// flavor; then the [model] options on top.
DeepSeekV3Args architecture(bool v32, const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& o) {
  DeepSeekV3Args a;
  if (o.hf_config) {
    a = args_from_hf_config(*o.hf_config, "the checkpoint's hf_config");
    TITAN_CHECK(a.vocab_size >= vocab, "the Hugging Face model has " + std::to_string(a.vocab_size) +
                                           " token embeddings but the tokenizer has " + std::to_string(vocab) + " tokens",
                "prepare the dataset with the tokenizer that came with the model");
    a.n_dense_layers = std::min(a.n_dense_layers, a.n_layers + o.mtp_layers);
  } else {
    a = v32 ? deepseek_v32_flavor(flavor, vocab) : deepseek_v3_flavor(flavor, vocab);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
  }
  a.num_mtp_layers = o.mtp_layers;  // a checkpoint's MTP modules train only when asked for
  a.mtp_loss_weight = o.mtp_loss_weight;
  a.load_balance_coeff = o.moe_load_balance_coeff;
  a.aux_loss_alpha = o.moe_aux_loss_alpha;
  a.validate();
  return a;
}

template <bool v32>
std::unique_ptr<CausalLM> build(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& options) {
  const DeepSeekV3Args a = architecture(v32, flavor, vocab, max_seq_len, options);
  TITAN_CHECK(!options.ep || options.ep->size() == 1 || a.n_dense_layers < a.n_layers + a.num_mtp_layers,
              "parallelism.expert_parallel_degree = " + std::to_string(options.ep ? options.ep->size() : 1) +
                  ": this architecture has no MoE layer (n_dense_layers = " + std::to_string(a.n_dense_layers) + ")",
              "set expert_parallel_degree = 1");
  auto m = build_placed(
      [&] { return std::make_unique<Transformer>(a, moe_factory(options), options.tp, options.pipeline_stages); });
  const ModelFamily& family = v32 ? v32_family() : v3_family();
  const Converters converters = converters_from_names(options.converters, family.name, family.converters);
  const bool names_dsa = std::any_of(options.converters.begin(), options.converters.end(),
                                     [](const std::string& c) { return c.rfind("dsa_", 0) == 0; });
  if (a.has_indexer())
    m->set_dsa_schedule(options.dsa, converters.dsa == OpForm::fused ? DsaImpl::fused : DsaImpl::small_ops);
  else
    TITAN_CHECK(options.dsa == DsaSchedule{} && !names_dsa,
                "[dsa] keys or a dsa_ converter are set, but this architecture has no lightning indexer",
                "remove them, or load a DeepSeek-V3.2 checkpoint");
  m->set_context_parallel(options.cp);
  m->set_async_tensor_parallel(options.async_tp);
  return m;
}

template <bool v32>
int64_t n_layers(const std::string& flavor, int64_t vocab, const ModelOptions& options) {
  if (options.hf_config) return args_from_hf_config(*options.hf_config, "the checkpoint's hf_config").n_layers;
  return (v32 ? deepseek_v32_flavor(flavor, vocab) : deepseek_v3_flavor(flavor, vocab)).n_layers;
}

template <bool v32>
DeepSeekV3Args planned(const PlanQuery& q) {
  DeepSeekV3Args a = v32 ? deepseek_v32_flavor(q.flavor, q.vocab) : deepseek_v3_flavor(q.flavor, q.vocab);
  return a;
}

template <bool v32>
ActivationModel activations(const PlanQuery& q) { return activation_model(planned<v32>(q), q); }
template <bool v32>
std::vector<int64_t> experts(const PlanQuery& q) { return experts_per_token(planned<v32>(q), q); }
template <bool v32>
std::vector<ContextParallelTraffic> cp_traffic(const PlanQuery& q) { return context_parallel_traffic(planned<v32>(q), q); }

// ---- Hugging Face conversion

bool reads(const nlohmann::json& config) {
  const std::string type = config.value("model_type", std::string("deepseek_v3"));
  return type == "deepseek_v3" || type == "deepseek_v32";
}

HfImport import_folder(const checkpoint::HfFolder& folder) {
  HfImport out;
  // The MTP layers the folder has weights for: transformers' save_pretrained writes none though
  // its config.json says num_nextn_predict_layers 1; the note says so (and what training does).
  const DeepSeekV3Args a = args_from_hf_folder(folder, &out.note);
  const auto shapes = state_shapes(a);
  std::map<std::string, Tensor> state = load_hf_state(folder, a, shapes);
  for (const auto& [name, shape] : shapes) out.state.emplace_back(name, state.at(name));
  out.model = a.has_indexer() ? "deepseek_v32" : "deepseek_v3";  // an indexer in every layer: V3.2
  out.hf_config = folder.config();
  out.mtp_layers = a.num_mtp_layers;
  return out;
}

// The architecture of a checkpoint's tensors: the HF config it recorded, else its flavor.
DeepSeekV3Args export_architecture(const HfExport& job) {
  DeepSeekV3Args a;
  if (job.hf_config) {
    a = args_from_hf_config(*job.hf_config, job.source + "/train_state.json");
    // A run continued from it may have trained fewer MTP modules than the original had (mtp_layers).
    int64_t mtp = 0;
    while (job.tensors.count("mtp." + std::to_string(mtp) + ".eh_proj.weight")) ++mtp;
    a.num_mtp_layers = mtp;
    a.n_dense_layers = std::min(a.n_dense_layers, a.n_layers + mtp);
    return a;
  }
  const bool v32 = job.model == "deepseek_v32";
  std::string flavors;
  for (const std::string& f : v32 ? deepseek_v32_flavor_names() : deepseek_v3_flavor_names())
    flavors += (flavors.empty() ? "" : ", ") + f;
  TITAN_CHECK(!job.flavor.empty(), "cannot tell the architecture of " + job.source, "pass --flavor (" + job.model + ": " + flavors + ")");
  const auto embedding = job.tensors.find("tok_embeddings.weight");
  const int64_t vocab = embedding == job.tensors.end() ? 0 : embedding->second.size(0);
  a = v32 ? deepseek_v32_flavor(job.flavor, vocab) : deepseek_v3_flavor(job.flavor, vocab);
  a.num_mtp_layers = job.mtp_layers;  // trained with [model] mtp_layers: its MTP modules export too
  // A model trained without the MoE layer is all-dense (see model.h).
  bool has_moe = false;
  for (const auto& [n, t] : job.tensors) has_moe |= n.find(".moe.") != std::string::npos;
  if (!has_moe) a.n_dense_layers = a.n_layers + a.num_mtp_layers;
  return a;
}

size_t export_folder(const HfExport& job, const std::filesystem::path& dir) {
  const DeepSeekV3Args a = export_architecture(job);
  // Exactly the architecture's weights, in its order; run-time buffers (e.g. MoE token counts)
  // have no place in an HF folder.
  const std::vector<std::pair<std::string, Tensor>> state = export_tensors(job, state_shapes(a));
  save_hf(dir, a, state, job.options);
  return state.size();
}

const HfConversion kHf{reads, import_folder, export_folder};

}  // namespace

std::unique_ptr<BlockFeedForward> moe_layer(const DeepSeekV3Args& a, int layer_id, const distributed::ProcessGroup* tp) {
  return std::make_unique<moe::MoE>(moe_args(a, tp, false), a.out_proj_std(layer_id));
}

std::unique_ptr<BlockFeedForward> moe_layer_tp_gather(const DeepSeekV3Args& a, int layer_id,
                                                      const distributed::ProcessGroup* tp) {
  return std::make_unique<moe::MoE>(moe_args(a, tp, true), a.out_proj_std(layer_id));
}

const ModelFamily& v3_family() {
  static const ModelFamily f{
      .name = "deepseek_v3",
      .flavors = deepseek_v3_flavor_names,
      .routed_experts = true,
      .multi_token_prediction = true,
      .sparse_attention = false,
      .converters = {kConverterRmsNorm, kConverterRope, kConverterGroupedMm, kConverterPermute},
      .build = build<false>,
      .n_layers = n_layers<false>,
      .activations = activations<false>,
      .experts_per_token = experts<false>,
      .context_parallel_traffic = cp_traffic<false>,
      .hf = &kHf,
  };
  return f;
}

const ModelFamily& v32_family() {
  static const ModelFamily f{
      .name = "deepseek_v32",
      .flavors = deepseek_v32_flavor_names,
      .routed_experts = true,
      .multi_token_prediction = false,
      .sparse_attention = true,
      .converters = {kConverterRmsNorm, kConverterRope, kConverterGroupedMm, kConverterPermute, kConverterDsa},
      .build = build<true>,
      .n_layers = n_layers<true>,
      .activations = activations<true>,
      .experts_per_token = experts<true>,
      .context_parallel_traffic = cp_traffic<true>,
      .hf = &kHf,
  };
  return f;
}

}  // namespace titan::models::deepseek_v3
