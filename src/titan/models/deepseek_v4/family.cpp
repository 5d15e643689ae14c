// DeepSeek-V4's spec (models/family.h): flavors, build, and what the memory planner needs beyond
// the parameters. [dsa] indexer_loss_coeff weighs the CSA indexers' KL loss (0: the indexers do
// not learn, as in transformers) and [dsa] topk overrides index_topk; V4 has no dense warm-up.
// [model] moe_load_balance_coeff is the learned MoE layers' bias rate, as for DeepSeek-V3.
#include "titan/models/deepseek_v4/family.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/models/activation_terms.h"
#include "titan/models/common.h"
#include "titan/models/converters.h"
#include "titan/models/deepseek_v4/hf_adapter.h"
#include "titan/models/deepseek_v4/model.h"
#include "titan/models/deepseek_v4/mtp.h"
#include "titan/models/deepseek_v4/plan.h"

namespace titan::models::deepseek_v4 {

namespace {

DeepSeekV4Args architecture(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& o) {
  // A checkpoint converted from Hugging Face records its config.json: that architecture.
  DeepSeekV4Args a = o.hf_config ? args_from_hf_config(*o.hf_config, "the checkpoint's config.json")
                                 : deepseek_v4_flavor(flavor, vocab);
  TITAN_CHECK(!o.hf_config || vocab <= a.vocab_size,
              "the tokenizer has " + std::to_string(vocab) + " tokens, the checkpoint's vocabulary " +
                  std::to_string(a.vocab_size),
              "use the tokenizer the checkpoint was trained with");
  if (o.dsa.topk > 0) a.index_topk = o.dsa.topk;
  a.load_balance_coeff = o.moe_load_balance_coeff;
  a.num_mtp_layers = o.mtp_layers;  // a checkpoint's MTP modules train only when asked for
  a.mtp_loss_weight = o.mtp_loss_weight;
  a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
  a.validate();
  return a;
}

std::unique_ptr<CausalLM> build(const std::string& flavor, int64_t vocab, int64_t max_seq_len, const ModelOptions& o) {
  TITAN_CHECK(o.dsa.warmup_steps == 0, "dsa.warmup_steps = " + std::to_string(o.dsa.warmup_steps) +
                                           ": DeepSeek-V4's indexers train beside the model from the first step",
              "remove dsa.warmup_steps (V4 has no dense warm-up stage)");
  TITAN_CHECK(o.moe_aux_loss_alpha == 0, "model.moe_aux_loss_alpha = " + std::to_string(o.moe_aux_loss_alpha) +
                                             ": deepseek_v4 balances its experts by the routing bias alone",
              "remove model.moe_aux_loss_alpha (model.moe_load_balance_coeff sets the bias's rate)");
  const DeepSeekV4Args a = architecture(flavor, vocab, max_seq_len, o);
  if (max_seq_len > 0) a.validate_sequence(max_seq_len);
  if (max_seq_len > 0 && o.cp) a.validate_context_parallel(max_seq_len, o.cp->size());
  models::moe::MoEArgs groups;  // the MoE's parallel groups (moe_args sets the rest)
  groups.ep = o.ep, groups.tp = o.tp, groups.tp_gather = o.moe_tp_gather;
  auto m = build_placed([&] { return std::make_unique<Transformer>(a, o.pipeline_stages, groups); });
  m->set_indexer_loss_coeff(o.dsa.indexer_loss_coeff);
  m->set_context_parallel(o.cp);
  return m;
}

// The pipeline splits the layers of the architecture build() makes (a converted checkpoint's own).
int64_t n_layers(const std::string& flavor, int64_t vocab, const ModelOptions& o) {
  return architecture(flavor, vocab, 0, o).n_layers;
}

// models/deepseek_v4/model.cpp's layer, f32: the streams into and between its two blocks, each
// hyper-connection's mixes and the collapsed input; the attention's query latent, queries (normed,
// roped), key = value row, output (and turned back), grouped projection and its compressor's
// projections and entries; the MoE's routed rows (K per token: w1, w3, product, w2 output) and the
// shared expert's. Under TP (parallelize.cpp) per token of the whole sequence: the streams, mixes
// and norms are this rank's 1/tp piece; the attention's input is gathered, the query latent, the
// key = value row and the compressor replicated, the heads and output groups 1/tp; the routed
// experts see 1/tp of the tokens (the MoE TP fix) or all of them through 1/tp of their hidden
// units (gather), the shared expert 1/tp of its units. An approximation the planner's measured
// test does not check for V4 yet.
ActivationModel activations(const PlanQuery& j) {
  const DeepSeekV4Args a = deepseek_v4_flavor(j.flavor, j.vocab);
  const double c = 4, d = double(a.dim), n = double(a.hc_mult), hd = double(a.head_dim), h = double(a.n_heads);
  const double t = j.tp, k = double(a.n_activated_experts);
  const double share = j.moe_tp_gather ? 1 : 1 / t, f = double(a.moe_inter_dim) / (j.moe_tp_gather ? t : 1);
  const double fs = double(a.moe_inter_dim) / t;  // the shared expert's units
  ActivationModel m;
  DeepSeekV4Args blocks = a;  // the main layers, then the MTP modules' (sliding-window) blocks
  blocks.num_mtp_layers = j.mtp_layers;
  for (LayerType type : with_mtp_layers(blocks).layer_types) {
    BlockTensors x;
    x.add(2 * n * d * c / t, true, true);                     // the streams into each block
    x.add(2 * ((n + 2) * n + d + 2 * d) * c / t, true);       // mixes, collapsed, normed (per block)
    if (t > 1) x.add(d * c, true);                            // the attention's gathered input
    x.add((double(a.q_lora_rank) * 2 + 2 * hd) * c, true, true);  // qr (normed), kv: replicated
    x.add(3 * h / t * hd * c, true, true);                    // q, o: this rank's heads
    x.add(double(a.o_groups * a.o_lora_rank) / t * c + d * c, true, true);  // its groups, the partial output
    const int64_t m_ratio = a.compress_ratio(type);
    if (m_ratio > 0) x.add((type == LayerType::csa ? 4 : 2) * hd * c + hd / double(m_ratio) * c, true);
    x.add(k * 4 * f * c * share + 4 * fs * c + 2 * d * c / t, true, true);  // experts' rows, routed output
    m.blocks.push_back(block_activations(x, n * d * c / t, 0, 0, (k * f * share + fs) * 3 * c + 2 * n * d * c / t));
  }
  m.embedding = n * d * c / t;
  m.head = (2 * d / t + double(a.vocab_size) / t) * c;
  m.head_backward = (double(a.vocab_size) / t + 2 * d / t) * c;
  return m;
}

std::vector<int64_t> experts_per_token(const PlanQuery& j) {
  const DeepSeekV4Args a = deepseek_v4_flavor(j.flavor, j.vocab);
  return std::vector<int64_t>(size_t(a.n_layers), a.n_activated_experts);
}

// Attention::cp's scheme (plan.h), in the planner's unit: bytes per token of a rank's share, per
// block and per other rank (the planner multiplies by cp - 1), the model's mean over its layer
// types, for the busiest rank (V4 trains in f32).
std::vector<ContextParallelTraffic> context_parallel_traffic(const PlanQuery& j) {
  if (j.cp <= 1) return {};
  const DeepSeekV4Args a = deepseek_v4_flavor(j.flavor, j.vocab);
  double sent = 0, entries = 0, indexer = 0;
  int64_t compressed = 0, csa = 0;
  for (LayerType t : a.layer_types) {
    const CpLayerTraffic x = context_parallel_layer_traffic(a, t, 1, j.seq_len, j.cp, 4);
    sent += x.sent_point_to_point(), entries += x.entries, indexer += x.indexer;
    compressed += t != LayerType::sliding, csa += t == LayerType::csa;
  }
  const double per = double(a.n_layers) * double(j.cp - 1) * double(j.seq_len) / double(j.cp);
  const std::string of = " of " + std::to_string(a.n_layers) + " layers)";
  return {{"send", 2 * sent / per,
           "the window's W - 1 key rows (CSA: and m overlap rows) before each chunk, to and from the neighbouring "
           "ranks, and their gradients back"},
          {"all_gather", entries / per, "compressed entries (" + std::to_string(compressed) + of},
          {"all_gather", indexer / per, "CSA indexer keys (" + std::to_string(csa) + of},
          {"reduce_scatter", (entries + indexer) / per, "their gradients back (the indexer's while it trains)"}};
}

// ---- Hugging Face conversion (hf_adapter.h has the names)

// The model's state (parameters and state buffers) by name with its shape, in the model's order.
std::vector<std::pair<std::string, Shape>> state_shapes(const DeepSeekV4Args& a) {
  nn::ParametersWithoutStorage declared;
  Transformer m(a);
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(name, p->var.shape());
  for (const auto& [name, t] : m.named_buffers(nn::BufferKind::state)) out.emplace_back(name, t.shape());
  return out;
}

// How many MTP modules "mtp.0." .. a state holds (by their e_proj).
int64_t mtp_modules(const std::map<std::string, Tensor>& state) {
  int64_t n = 0;
  while (state.count("mtp." + std::to_string(n) + ".e_proj.weight")) ++n;
  return n;
}

bool reads(const nlohmann::json& config) { return config.value("model_type", std::string()) == "deepseek_v4"; }

HfImport import_folder(const checkpoint::HfFolder& folder) {
  DeepSeekV4Args a = args_from_hf_config(folder.config(), (folder.dir() / "config.json").string());
  std::map<std::string, Tensor> hf;
  for (const std::string& name : folder.names()) {
    if (folder.is_scale(name)) continue;  // read with its FP8 / FP4 weight
    hf[name] = name.ends_with("tid2eid") ? folder.load_i64(name) : folder.load_f32(name);
  }
  std::map<std::string, Tensor> ours = state_from_hf(hf, folder.dir().string());
  // The MTP modules the folder has (the release's mtp.0; transformers' save_pretrained writes none):
  // imported; a run trains them with model.mtp_layers >= their count and drops them without it.
  a.num_mtp_layers = mtp_modules(ours);
  HfImport out;
  for (const auto& [name, shape] : state_shapes(a)) {
    const auto it = ours.find(name);
    TITAN_CHECK(it != ours.end(), folder.dir().string() + " lacks the weight our " + name + " comes from",
                "convert a complete DeepseekV4ForCausalLM folder (its config.json and every shard)");
    TITAN_CHECK(it->second.shape() == shape,
                folder.dir().string() + ": " + name + " is " + it->second.shape().str() + ", its config.json needs " +
                    shape.str(),
                "the weights and config.json must come from the same model");
    out.state.emplace_back(name, it->second);
    ours.erase(it);
  }
  TITAN_CHECK(ours.empty(), folder.dir().string() + " holds " + std::to_string(ours.size()) +
                                " tensors the model does not have, e.g. " + (ours.empty() ? "" : ours.begin()->first),
              "convert a DeepseekV4ForCausalLM folder of this config.json");
  out.model = family().name;
  out.hf_config = folder.config();
  out.mtp_layers = a.num_mtp_layers;
  if (a.num_mtp_layers > 0)
    out.note = "imported " + std::to_string(a.num_mtp_layers) +
               " multi-token prediction module(s) (mtp.*): training uses them with --model.mtp_layers=" +
               std::to_string(a.num_mtp_layers) + ", and drops them without it";
  return out;
}

size_t export_folder(const HfExport& job, const std::filesystem::path& dir) {
  DeepSeekV4Args a;
  if (job.hf_config) {
    a = args_from_hf_config(*job.hf_config, job.source + "/train_state.json");
  } else {
    TITAN_CHECK(!job.flavor.empty(), "cannot tell the architecture of " + job.source, "pass --flavor (debugmodel, flash, pro)");
    const auto embedding = job.tensors.find("embed_tokens.weight");
    a = deepseek_v4_flavor(job.flavor, embedding == job.tensors.end() ? 0 : embedding->second.size(0));
  }
  a.num_mtp_layers = mtp_modules(job.tensors);  // a run trained with model.mtp_layers: they export too
  const auto state = export_tensors(job, state_shapes(a));
  const std::map<std::string, Tensor> ours(state.begin(), state.end());
  nlohmann::json config = hf_config(a);
  if (job.options.quantize != checkpoint::HfQuantization::none) {
    // The release's layout, which transformers reads through its FP8 integration (spec 6.4).
    const bool fp4 = job.options.quantize == checkpoint::HfQuantization::fp8_fp4;
    const auto tensors = state_to_release(ours, fp4);
    config["quantization_config"] = {{"quant_method", "fp8"},      {"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},              {"weight_block_size", {128, 128}},
                                     {"scale_fmt", "ue8m0"},       {"expert_dtype", fp4 ? "fp4" : "fp8"}};
    checkpoint::HfWriteOptions options = job.options;
    options.keep_dtypes = true;
    checkpoint::save_hf_folder(dir, config, tensors, options);
    return tensors.size();
  }
  const std::map<std::string, Tensor> hf = state_to_hf(ours);
  std::vector<std::pair<std::string, Tensor>> tensors(hf.begin(), hf.end());
  checkpoint::save_hf_folder(dir, config, tensors, job.options);
  return tensors.size();
}

const HfConversion kHf{reads, import_folder, export_folder};

}  // namespace

const ModelFamily& family() {
  static const ModelFamily f{
      .name = "deepseek_v4",
      .flavors = deepseek_v4_flavor_names,
      .routed_experts = true,
      .multi_token_prediction = true,
      .sparse_attention = true,
      // the MoE's (models/moe/moe.h), the mHC maps' (hyper_connection.h), the compressors' (attention.h)
      .converters = {kConverterGroupedMm, kConverterPermute, kConverterHyperConnection, kConverterCompressor},
      .build = build,
      .n_layers = n_layers,
      .activations = activations,
      .experts_per_token = experts_per_token,
      .context_parallel_traffic = context_parallel_traffic,
      .hf = &kHf,
  };
  return f;
}

}  // namespace titan::models::deepseek_v4
