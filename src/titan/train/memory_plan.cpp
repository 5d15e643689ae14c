#include "titan/train/memory_plan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "titan/core/error.h"
#include "titan/data/tokenizer.h"
#include "titan/distributed/device_mesh.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/pipeline_simulator.h"
#include "titan/distributed/pipeline_stages.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/llama3/args.h"
#include "titan/train/activation_plan.h"

namespace titan::train {

namespace {

namespace pp = distributed::pp;

constexpr int kRootUnit = -2;  // FSDP's root unit (the final norm): gathered for the whole step

// One parameter as a rank holds it.
struct Local {
  const PlannedParam* p;
  double elems = 0;        // this rank's piece before FSDP (after TP and EP)
  double shard = 0;        // what FSDP leaves it (rows padded), or elems without FSDP
  double gathered = 0;     // FSDP: the unsharded piece, rows padded (elems without FSDP)
  int unit = 0;            // FSDP unit: kRootUnit, else the block id / embedding / head / MTP
};

bool is_expert(const PlannedParam& p, const PlanMesh& m) { return p.routed_expert && m.ep > 1; }

Local local_param(const PlannedParam& p, const PlanMesh& m) {
  Shape s = p.shape;
  if (m.tp > 1 && p.tp_dim >= 0) s[size_t(p.tp_dim)] /= m.tp;
  if (is_expert(p, m)) s[0] /= m.ep;
  Local l{&p, double(s.numel())};
  const double rest = s[0] > 0 ? l.elems / double(s[0]) : 0;
  if (m.fsdp() > 1) {
    const int n = is_expert(p, m) ? m.efsdp() : m.fsdp();
    const double rows = std::ceil(double(s[0]) / n);
    l.shard = rows * rest;
    l.gathered = rows * n * rest;
  } else {
    l.shard = l.gathered = l.elems;
  }
  // The trainers' units: the embedding, each block, each MTP module, the output; the final norm is root.
  l.unit = p.name == "norm.weight" ? kRootUnit : p.name.starts_with("mtp.") ? PlannedParam::kMtp + std::stoi(p.name.substr(4)) : p.layer;
  return l;
}

// What one stage of the pipeline (or the whole model) holds.
struct StagePart {
  std::vector<pp::StageLayers> stages;  // the rank's stages
  bool holds(const PlannedParam& p) const {
    for (const pp::StageLayers& st : stages) {
      if (p.layer == PlannedParam::kEmbedding && st.embedding) return true;
      if (p.layer >= PlannedParam::kHead && st.head) return true;
      if (p.layer >= st.begin && p.layer < st.end) return true;
    }
    return false;
  }
  int blocks() const {
    int n = 0;
    for (const pp::StageLayers& st : stages) n += st.end - st.begin;
    return n;
  }
  bool embedding() const { return std::any_of(stages.begin(), stages.end(), [](auto& s) { return s.embedding; }); }
  bool head() const { return std::any_of(stages.begin(), stages.end(), [](auto& s) { return s.head; }); }
};

// Most partial sums a binary tree sum of m leaves holds while its last leaf is being made:
// the partials of every prefix (popcount) plus the leaf in progress.
int tree_sum_buffers(int64_t m) {
  int most = 0;
  for (int64_t k = 0; k < m; ++k) most = std::max(most, std::popcount(uint64_t(k)));
  return most + 1;
}

struct PlanJob {
  const JobConfig& c;
  PlanMesh m;
  ModelShape model;
  bool bf16 = false;
  int64_t micro_tokens = 0;  // tokens of one micro-batch on one rank (CP's share)
  int64_t microbatches = 1;  // per step on this rank (accumulation or the pipeline's)
};

// Activation and temporaries bytes per token of a stage (activation_plan.h), plus the
// pipeline's buffers to and from the neighbouring stages.
std::pair<double, double> stage_activations(const PlanJob& j, const StagePart& part) {
  ActivationJob aj{j.c.model.name, j.c.model.flavor, j.model.vocab, j.c.training.seq_len, j.c.dsa.topk,
                   j.c.model.mtp_layers, j.m.tp, j.m.cp, j.bf16};
  const ActivationModel m = activation_model(aj);
  std::vector<int> blocks;
  for (const pp::StageLayers& st : part.stages)
    for (int l = st.begin; l < st.end; ++l) blocks.push_back(l);
  if (part.head())
    for (int d = 0; d < j.c.model.mtp_layers; ++d) blocks.push_back(int(j.model.n_layers) + d);
  const double pipe = j.m.pp > 1 ? 2 * double(j.model.dim) / j.m.tp * (j.bf16 ? 2 : 4) : 0;
  return {activation_peak(m, blocks, part.embedding(), part.head(), j.c.activation_checkpoint.mode),
          backward_temporaries(m, blocks, part.head(), j.c.activation_checkpoint.mode) + pipe};
}

struct RankPlan {
  PlanCategories peak;
  std::vector<std::pair<std::string, double>> terms;
  double swapped = 0, non_expert_before_fsdp = 0, indexer_before_fsdp = 0;
  std::vector<Local> params;
};

RankPlan plan_rank(const PlanJob& j, const StagePart& part, int in_flight) {
  RankPlan r;
  const bool fsdp = j.m.fsdp() > 1;
  std::map<int, double> unit_gathered, unit_grads;  // by FSDP unit
  double master = 0, compute = 0, expert_elems = 0, all_elems = 0;
  for (const PlannedParam& p : j.model.params) {
    if (!part.holds(p)) continue;
    const Local l = local_param(p, j.m);
    r.params.push_back(l);
    master += l.shard;
    all_elems += l.elems;
    if (p.routed_expert) expert_elems += l.elems;
    if (p.name.find(".indexer.") != std::string::npos) r.indexer_before_fsdp += l.elems * 8;
    const bool bf16 = j.bf16 && p.gemm;
    if (bf16) compute += fsdp ? l.shard : l.elems;
    unit_gathered[l.unit] += l.gathered * (bf16 ? 2 : 4);
    unit_grads[l.unit] += l.gathered * 4;
  }
  r.non_expert_before_fsdp = (all_elems - expert_elems) * 8;
  auto term = [&](std::string name, double bytes, double PlanCategories::*cat) {
    if (bytes <= 0) return;
    r.peak.*cat += bytes;
    r.terms.emplace_back(std::move(name), bytes);
  };
  using C = PlanCategories;
  term(fsdp ? "parameters: f32 master shards" : "parameters: f32 masters", master * 4, &C::parameters);
  term("parameters: bf16 compute copies", compute * 2, &C::parameters);
  term("parameters: RoPE tables", j.model.rope_table_bytes, &C::parameters);
  if (fsdp) {
    // Gathered at once: the root and, without PP, two consecutive units (the one running and the
    // one prefetched; "never" keeps every unit after forward); under PP every unit of the stage.
    std::vector<double> order;
    double root = 0, all = 0;
    for (const auto& [unit, bytes] : unit_gathered) {
      if (unit == kRootUnit) root = bytes;
      else order.push_back(bytes);
      all += bytes;
    }
    double pair = 0;
    for (size_t i = 0; i < order.size(); ++i) pair = std::max(pair, order[i] + (i + 1 < order.size() ? order[i + 1] : 0));
    const bool every = j.m.pp > 1 || j.c.parallelism.fsdp_reshard_after_forward == "never";
    term(every ? "parameters: every FSDP unit gathered" : "parameters: FSDP units gathered (running + prefetched)",
         every ? all : root + pair, &C::parameters);
  }
  // Gradients. Without PP: the f32 gradients (FSDP: shards) summed over micro-batches as a binary
  // tree (tree_sum.h: its partial sums), plus under FSDP the unsharded gradients of the unit in
  // backward and of the previous one while its reduce-scatter runs: at most two units (fsdp.cpp
  // waits for the previous unit's before issuing the next), the bound the plan counts; how much of
  // the second is still held depends on how soon the engine sends it (measured: 0.1 to 0.7).
  // Under PP each micro-batch's gradients stay apart until its stages finish and join the tree
  // unsharded (pipeline_step.cpp); FSDP reduce-scatters the sum once, at the step's end.
  const int trees = tree_sum_buffers(j.microbatches);
  const std::string tree = trees > 1 ? fmt::format(" x {} (tree sum over micro-batches)", trees) : "";
  double largest_unit = 0, all_units = 0;
  for (const auto& [unit, bytes] : unit_grads) largest_unit = std::max(largest_unit, bytes), all_units += bytes;
  if (j.m.pp > 1) {
    term("gradients: f32 " + std::string(fsdp ? "unsharded gradients" : "gradients") + tree, (fsdp ? all_units : master * 4) * trees,
         &C::gradients);
    if (fsdp) term("gradients: f32 shards (the step's reduce-scatter)", master * 4, &C::gradients);
  } else {
    term("gradients: f32 " + std::string(fsdp ? "shards" : "gradients") + tree, master * 4 * trees, &C::gradients);
    if (fsdp) term("gradients: unsharded, the unit in backward + the one reduce-scattering", 2 * largest_unit, &C::gradients);
  }
  // Optimizer: two f32 moments of the masters, or two swap chunks in memory.
  const double moments = master * 8;
  if (j.c.optimizer.swap == "file") {
    const double chunk = double(j.c.optimizer.swap_chunk_mb) * (1 << 20);
    term("optimizer: two swap chunk buffers", std::min(2 * chunk, moments + 8192), &C::optimizer);
    r.swapped = moments;
  } else {
    term("optimizer: AdamW exp_avg + exp_avg_sq (f32)", moments, &C::optimizer);
  }
  // Activations of the micro-batches in flight; temporaries of one backward.
  const auto [act, temp] = stage_activations(j, part);
  term(fmt::format("activations: {} tokens x {} micro-batch{} in flight, checkpointing {}", j.micro_tokens, in_flight,
                   in_flight > 1 ? "es" : "", j.c.activation_checkpoint.mode),
       act * double(j.micro_tokens) * in_flight, &C::activations);
  term("temporaries: activation gradients (the loss's or a block's backward)", temp * double(j.micro_tokens), &C::temporaries);
  // A unit's reduce-scatters receive every rank's piece of its f32 gradients (comm_engine.cpp).
  if (fsdp) term("temporaries: a unit's reduce-scatter receive buffers", largest_unit, &C::temporaries);
  return r;
}

// Bytes each collective sends per step from one rank of the busiest stage (the analytic minimum
// of distributed.md section 9).
std::vector<PlanCollective> plan_traffic(const PlanJob& j, const RankPlan& r, const StagePart& part) {
  std::vector<PlanCollective> out;
  const PlanMesh& m = j.m;
  const double mb = double(j.microbatches), eb = j.bf16 ? 2 : 4;
  const double tokens = double(j.micro_tokens);
  if (m.fsdp() > 1) {
    const double n = m.fsdp(), share = (n - 1) / n;
    double gather = 0, grads = 0;
    const std::string& policy = j.c.parallelism.fsdp_reshard_after_forward;
    for (const Local& l : r.params) {
      const double bytes = l.gathered * (j.bf16 && l.p->gemm ? 2 : 4);
      const bool output = l.unit == PlannedParam::kHead;
      const bool reshard = policy == "always" || (policy == "default" && !output && m.pp == 1);
      gather += l.unit == kRootUnit ? bytes : bytes * (reshard ? 2 : 1) * (m.pp > 1 ? 1 : mb);
      grads += l.gathered * 4;
    }
    out.push_back({"fsdp", "all_gather", gather * share, "parameters before forward (and backward, resharded units)"});
    out.push_back({"fsdp", "reduce_scatter", grads * share * (m.pp > 1 ? 1 : mb), "f32 gradients into the shards"});
    // The minimum: once per step (this implementation reduces each micro-batch's shards, which
    // keeps HSDP bit-identical to one rank: accumulation times this).
    if (m.dp_replicate > 1)
      out.push_back({"dp_replicate", "all_reduce", 2.0 * (m.dp_replicate - 1) / m.dp_replicate * grads / n,
                     "HSDP: each shard's gradients over the replicas, once per step"});
  } else if (m.dp_replicate > 1) {
    double grads = 0;
    for (const Local& l : r.params) grads += l.elems * 4;
    out.push_back({"dp_replicate", "all_reduce", 2.0 * (m.dp_replicate - 1) / m.dp_replicate * grads, "DDP gradients"});
  }
  if (m.tp > 1) {
    const double share = double(m.tp - 1) / m.tp, x = tokens * double(j.model.dim) * eb;
    const double pairs = 2.0 * part.blocks() + 1;
    out.push_back({"tp", "all_gather", 2 * pairs * share * x * mb, "sequence-parallel inputs of column-parallel GEMMs"});
    out.push_back({"tp", "reduce_scatter", 2 * pairs * share * x * mb, "outputs of row-parallel GEMMs"});
    double replicated = 0;
    for (const Local& l : r.params)
      // The indexer is computed whole on every TP rank, gradients included: nothing to sum.
      if (l.p->tp_dim < 0 && !is_expert(*l.p, m) && l.p->name.find(".indexer.") == std::string::npos)
        replicated += l.elems * 4;
    out.push_back({"tp", "all_reduce", 2 * share * (replicated + 3 * tokens * 4 * mb), "replicated weights' partial gradients, loss parallel"});
  }
  if (m.ep > 1 && j.model.model != "llama3") {
    namespace ds = models::deepseek_v3;
    const ds::DeepSeekV3Args a = j.model.model == "deepseek_v32" ? ds::deepseek_v32_flavor(j.c.model.flavor, j.model.vocab)
                                                                 : ds::deepseek_v3_flavor(j.c.model.flavor, j.model.vocab);
    int moe_layers = 0;
    for (const pp::StageLayers& st : part.stages)
      for (int l = st.begin; l < st.end; ++l) moe_layers += a.is_moe_layer(l);
    // Each rank routes its tokens (its sequence piece under TP) to top-k experts; uniform routing
    // sends (ep - 1) / ep of the rows away, in dispatch and combine, forward and backward.
    const double rows = tokens / m.tp * double(a.n_activated_experts);
    out.push_back({"ep", "all_to_all", 4.0 * moe_layers * rows * double(a.dim) * eb * (m.ep - 1) / m.ep * mb,
                   "token dispatch and combine (uniform routing)"});
  }
  if (m.cp > 1) {
    const double share = double(m.cp - 1);
    if (j.model.model == "llama3") {
      const auto a = models::llama3::llama3_flavor(j.c.model.flavor, j.model.vocab);
      const double kv = tokens * 2.0 * double(a.kv_heads() * a.head_dim()) / m.tp * eb;
      out.push_back({"cp", "send", 3 * share * kv * part.blocks() * mb, "ring attention: K/V forward, K/V and dK/dV backward"});
    } else {
      namespace ds = models::deepseek_v3;
      const ds::DeepSeekV3Args a = j.model.model == "deepseek_v32" ? ds::deepseek_v32_flavor(j.c.model.flavor, j.model.vocab)
                                                                   : ds::deepseek_v3_flavor(j.c.model.flavor, j.model.vocab);
      const double rows = tokens * double(a.kv_lora_rank + a.qk_rope_head_dim + (a.has_indexer() ? a.index_head_dim : 0));
      out.push_back({"cp", "all_gather", share * rows * eb * part.blocks() * mb, "latent KV and indexer keys along the sequence"});
      out.push_back({"cp", "reduce_scatter", share * rows * 4 * part.blocks() * mb, "their gradients back"});
    }
  }
  if (m.pp > 1) {
    const double x = double(j.c.parallelism.pipeline_parallel_microbatch_size) * double(j.c.training.seq_len) / m.cp *
                     double(j.model.dim) / m.tp * eb;
    out.push_back({"pp", "send", 2 * x * mb, "activations forward, their gradients backward (per stage boundary)"});
  }
  return out;
}

}  // namespace

int64_t tokenizer_vocab(const JobConfig& c) {
  std::string file = c.model.tokenizer_path;
  if (file.empty() && !c.model.hf_assets_path.empty())
    file = (std::filesystem::path(c.model.hf_assets_path) / "tokenizer.json").string();
  if (file.empty() || !std::filesystem::exists(file)) return 0;
  return data::Tokenizer::load(file).vocab_size();
}

PlanMesh plan_mesh(const JobConfig& c, int world, const std::string& source) {
  const Parallelism& p = c.parallelism;
  const auto d = distributed::resolve_mesh({p.pipeline_parallel_degree, p.data_parallel_replicate_degree,
                                            p.data_parallel_shard_degree, p.context_parallel_degree, p.tensor_parallel_degree},
                                           world, source);
  distributed::check_expert_degree(d, p.expert_parallel_degree, source);
  return {world, d[0], d[1], d[2], d[3], d[4], int(p.expert_parallel_degree)};
}

MemoryPlan plan_memory(const JobConfig& c, int world, int64_t vocab, const std::string& source) {
  MemoryPlan plan;
  plan.mesh = plan_mesh(c, world, source);
  const PlanMesh& m = plan.mesh;
  plan.model = model_shape(c.model.name, c.model.flavor, vocab, c.training.seq_len, c.model.mtp_layers,
                           c.parallelism.moe_tp_scheme == "gather");
  plan.vocab = plan.model.vocab;
  for (const PlannedParam& p : plan.model.params) {
    plan.total_params += double(p.shape.numel());
    if (p.routed_expert) plan.expert_params += double(p.shape.numel());
  }
  PlanJob j{c, m, plan.model, c.training.mixed_precision_param == "bfloat16" && c.training.dtype == "float32"};
  const int64_t seq_tokens = c.training.seq_len / m.cp;
  std::vector<StagePart> parts;
  std::vector<int> in_flight;
  if (m.pp > 1) {
    const int64_t mbs = c.parallelism.pipeline_parallel_microbatch_size;
    const pp::Schedule s = pp::make_schedule(c.parallelism.pipeline_parallel_schedule, m.pp, int(c.training.local_batch_size / mbs));
    const auto stages = pp::split_stages(int(plan.model.n_layers), s.stages(), int(c.parallelism.pipeline_parallel_first_stage_less_layers),
                                         int(c.parallelism.pipeline_parallel_last_stage_less_layers));
    const pp::Simulation sim = pp::simulate(s, pp::Costs{{{1, 1, 1}}, 0});
    for (int r = 0; r < m.pp; ++r) {
      StagePart part;
      for (int st : s.stages_of(r)) part.stages.push_back(stages[size_t(st)]);
      parts.push_back(part);
      // The simulator counts stage-sized forwards in flight; a rank of v stages holds v of them per micro-batch.
      in_flight.push_back(std::max(1, sim.peak_in_flight[size_t(r)] / s.stages_per_rank));
    }
    j.micro_tokens = mbs * seq_tokens;
    j.microbatches = s.microbatches;
  } else {
    parts.push_back({{{0, int(plan.model.n_layers), true, true}}});
    in_flight.push_back(1);
    j.micro_tokens = c.training.local_batch_size * seq_tokens;
    j.microbatches = gradient_accumulation_steps(c, m.dp_replicate * m.dp_shard);
  }
  plan.accumulation = j.microbatches;
  RankPlan best;
  for (size_t r = 0; r < parts.size(); ++r) {
    RankPlan rp = plan_rank(j, parts[r], in_flight[r]);
    if (r == 0 || rp.peak.total() > best.peak.total()) {
      best = std::move(rp);
      plan.stage = int(r);
    }
  }
  plan.peak = best.peak;
  plan.terms = best.terms;
  plan.swapped_bytes = best.swapped;
  plan.non_expert_weights_grads_before_fsdp = best.non_expert_before_fsdp;
  plan.indexer_weights_grads_before_fsdp = best.indexer_before_fsdp;
  plan.traffic = plan_traffic(j, best, parts[size_t(plan.stage)]);
  return plan;
}

int smallest_world(const JobConfig& c, int64_t vocab, double device_bytes, const std::string& source, int max_world) {
  const Parallelism& p = c.parallelism;
  const int64_t fixed = p.pipeline_parallel_degree * p.data_parallel_replicate_degree * p.context_parallel_degree *
                        p.tensor_parallel_degree;
  JobConfig grown = c;
  for (int64_t shard = 1; shard * fixed <= max_world; ++shard) {
    grown.parallelism.data_parallel_shard_degree = shard;
    const int world = int(shard * fixed);
    if (p.expert_parallel_degree > 1 && (shard * p.context_parallel_degree * p.tensor_parallel_degree) % p.expert_parallel_degree)
      continue;
    if (grown.training.global_batch_size > 0 &&
        grown.training.global_batch_size % (grown.training.local_batch_size * p.data_parallel_replicate_degree * shard))
      continue;
    if (plan_memory(grown, world, vocab, source).peak.total() <= device_bytes) return world;
  }
  return 0;
}

std::string plan_str(const MemoryPlan& p) {
  const auto gib = [](double b) {
    return b >= double(int64_t(1) << 30) ? fmt::format("{:.2f} GiB", b / double(int64_t(1) << 30))
                                         : fmt::format("{:.2f} MiB", b / double(1 << 20));
  };
  const PlanMesh& m = p.mesh;
  std::string s = fmt::format("mesh: {} ranks = pp {} x dp_replicate {} x dp_shard {} x cp {} x tp {}{}\n", m.world, m.pp,
                              m.dp_replicate, m.dp_shard, m.cp, m.tp, m.ep > 1 ? fmt::format(", ep {}", m.ep) : "");
  s += fmt::format("model: {:.2f}B parameters ({:.1f}% in routed experts), vocabulary {}; f32 weights + gradients {:.0f} GB\n",
                   p.total_params / 1e9, 100 * p.expert_params / std::max(1.0, p.total_params), p.vocab,
                   p.total_params * 8 / 1e9);
  s += fmt::format("per rank of pipeline rank {} (the busiest): f32 weights + gradients of all but the routed experts, "
                   "before FSDP: {:.1f} GB{}\n",
                   p.stage, p.non_expert_weights_grads_before_fsdp / 1e9,
                   p.indexer_weights_grads_before_fsdp > 0
                       ? fmt::format(" ({:.1f} GB of it the lightning indexers, whole on every TP rank)",
                                     p.indexer_weights_grads_before_fsdp / 1e9)
                       : "");
  s += fmt::format("\npeak memory per rank by category ({} micro-batch{} per step)\n", p.accumulation,
                   p.accumulation > 1 ? "es" : "");
  const std::pair<const char*, double> cats[] = {{"parameters", p.peak.parameters}, {"gradients", p.peak.gradients},
                                                 {"optimizer", p.peak.optimizer},   {"activations", p.peak.activations},
                                                 {"temporaries", p.peak.temporaries}};
  for (const auto& [name, bytes] : cats) {
    s += fmt::format("  {:<12} {:>12}\n", name, gib(bytes));
    for (const auto& [what, b] : p.terms)
      if (what.starts_with(std::string(name).substr(0, 6))) s += fmt::format("      {:>12}  {}\n", gib(b), what.substr(what.find(": ") + 2));
  }
  s += fmt::format("  {:<12} {:>12}\n", "total", gib(p.peak.total()));
  if (p.swapped_bytes > 0) s += fmt::format("  optimizer state on disk (swap): {}\n", gib(p.swapped_bytes));
  s += "\ncommunication per step, bytes one rank sends\n";
  for (const PlanCollective& c : p.traffic)
    s += fmt::format("  {:<13} {:<15} {:>12}  {}\n", c.group, c.op, gib(c.bytes), c.what);
  if (p.traffic.empty()) s += "  none (one rank)\n";
  return s;
}

nlohmann::json plan_json(const MemoryPlan& p) {
  const PlanMesh& m = p.mesh;
  nlohmann::json j;
  j["mesh"] = {{"world", m.world}, {"pp", m.pp}, {"dp_replicate", m.dp_replicate}, {"dp_shard", m.dp_shard},
               {"cp", m.cp},       {"tp", m.tp}, {"ep", m.ep}};
  j["total_params"] = p.total_params;
  j["expert_params"] = p.expert_params;
  j["vocab"] = p.vocab;
  j["stage"] = p.stage;
  j["non_expert_weights_grads_before_fsdp"] = p.non_expert_weights_grads_before_fsdp;
  j["indexer_weights_grads_before_fsdp"] = p.indexer_weights_grads_before_fsdp;
  j["peak"] = {{"parameters", p.peak.parameters},   {"gradients", p.peak.gradients},
               {"optimizer", p.peak.optimizer},     {"activations", p.peak.activations},
               {"temporaries", p.peak.temporaries}, {"total", p.peak.total()}};
  j["swapped_bytes"] = p.swapped_bytes;
  j["terms"] = nlohmann::json::array();
  for (const auto& [what, bytes] : p.terms) j["terms"].push_back({{"what", what}, {"bytes", bytes}});
  j["traffic"] = nlohmann::json::array();
  for (const PlanCollective& c : p.traffic) j["traffic"].push_back({{"group", c.group}, {"op", c.op}, {"bytes", c.bytes}, {"what", c.what}});
  return j;
}

}  // namespace titan::train
