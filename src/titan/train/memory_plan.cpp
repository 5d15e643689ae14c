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
#include "titan/optim/muon.h"
#include "titan/train/activation_plan.h"
#include "titan/train/comm_plan.h"
#include "titan/train/pipeline_step.h"
#include "titan/train/trainer.h"

namespace titan::train {

namespace {

namespace pp = distributed::pp;
using plan::Local;
using plan::PlanJob;
using plan::StagePart;

// Most partial sums a binary tree sum of m leaves holds while its last leaf is being made:
// the partials of every prefix (popcount) plus the leaf in progress.
int tree_sum_buffers(int64_t m) {
  int most = 0;
  for (int64_t k = 0; k < m; ++k) most = std::max(most, std::popcount(uint64_t(k)));
  return most + 1;
}

// The busiest rank's plan as it is built: per category, its named terms.
struct RankPlan {
  PlanCategories peak;
  std::vector<std::pair<std::string, double>> terms;
  double swapped = 0, non_expert_before_fsdp = 0, tp_whole_before_fsdp = 0;
  double state = 0;  // bytes of optimizer state (what a checkpoint saves of it), in memory or swapped
  std::vector<Local> params;
  double master = 0, compute = 0;                   // elements: f32 masters (shards), bf16 copies
  double reduced_master = 0;                        // ... the masters whose gradients a reduce-scatter makes
  std::map<int, double> unit_gathered, unit_grads;  // bytes by FSDP unit, in the order they run
  std::map<int, double> unit_cast;  // ... of the bf16 shards cast for its all-gather (FSDP, bf16 only)
  std::map<int, double> unit_reduced;  // ... of its gradients that a reduce-scatter sends (group > 1)
  void term(std::string name, double bytes, double PlanCategories::*category) {
    if (bytes <= 0) return;
    peak.*category += bytes;
    terms.emplace_back(std::move(name), bytes);
  }
  double largest_unit_grads() const {
    double most = 0;
    for (const auto& [unit, bytes] : unit_grads) most = std::max(most, bytes);
    return most;
  }
};

void collect_params(const PlanJob& j, const StagePart& part, RankPlan& r) {
  double expert_elems = 0, all_elems = 0;
  for (const PlannedParam& p : j.model.params) {
    if (!part.holds(p)) continue;
    const Local l = plan::local_param(p, j.m);
    r.params.push_back(l);
    r.master += l.shard;
    all_elems += l.elems;
    if (p.routed_expert) expert_elems += l.elems;
    // Whole on every TP rank and computed whole there (no partial gradients): TP saves none of it.
    if (p.tp_dim < 0 && !p.tp_partial_grad && !p.routed_expert) r.tp_whole_before_fsdp += l.elems * 8;
    const bool bf16 = j.bf16 && p.gemm;
    if (bf16 && j.m.fsdp() > 1) r.unit_cast[l.unit] += l.shard * 2;
    else if (bf16) r.compute += l.elems;
    r.unit_gathered[l.unit] += l.gathered * (bf16 ? 2 : 4);
    r.unit_grads[l.unit] += l.gathered * 4;
    if (j.m.fsdp() > 1 && (!plan::is_expert(p, j.m) || j.m.efsdp() > 1)) {
      r.unit_reduced[l.unit] += l.gathered * 4;
      r.reduced_master += l.shard;
    }
  }
  r.non_expert_before_fsdp = (all_elems - expert_elems) * 8;
}

// The largest sum of two consecutive units' bytes (the one running and the one prefetched), and
// the root's and every unit's.
struct UnitBytes {
  double root = 0, pair = 0, all = 0;
};
UnitBytes unit_bytes(const std::map<int, double>& by_unit) {
  UnitBytes b;
  std::vector<double> order;
  for (const auto& [unit, bytes] : by_unit) {
    if (unit == plan::kRootUnit) b.root = bytes;
    else order.push_back(bytes);
    b.all += bytes;
  }
  for (size_t i = 0; i < order.size(); ++i) b.pair = std::max(b.pair, order[i] + (i + 1 < order.size() ? order[i + 1] : 0));
  return b;
}

// Masters, bf16 copies, RoPE tables, and the FSDP units gathered at once: the root and two
// consecutive units (the one running and the one prefetched; "never" keeps every unit after
// forward), under PP too with FSDP's zero3 (fsdp.h); under PP per step every unit of the stage
// stays gathered. Under FSDP no bf16 copy is kept: each gather casts the unit's shards
// (fsdp.cpp) and frees them once sent, so at most the root's and two units' bf16 shards exist
// (per stream).
void parameter_terms(const PlanJob& j, RankPlan& r) {
  using C = PlanCategories;
  const bool fsdp = j.m.fsdp() > 1;
  r.term(fsdp ? "parameters: f32 master shards" : "parameters: f32 masters", r.master * 4, &C::parameters);
  r.term("parameters: bf16 compute copies", r.compute * 2, &C::parameters);
  r.term("parameters: RoPE tables and routing buffers", j.model.buffer_bytes, &C::parameters);
  if (!fsdp) return;
  const std::string streams = j.streams > 1 ? " x 2 (an F&B pair's forward and backward taking turns)" : "";
  const UnitBytes cast = unit_bytes(r.unit_cast);
  r.term("parameters: bf16 shards cast for the all-gathers in flight (no persistent copy)" + streams,
         cast.root + cast.pair * j.streams, &C::parameters);
  const UnitBytes gathered = unit_bytes(r.unit_gathered);
  const bool every = j.fsdp_per_step() || j.c.parallelism.fsdp_reshard_after_forward == distributed::ReshardAfterForward::never;
  r.term(every ? "parameters: every FSDP unit gathered" : "parameters: FSDP units gathered (running + prefetched)" + streams,
         every ? gathered.all : gathered.root + gathered.pair * j.streams, &C::parameters);
}

// Without PP: the f32 gradients (FSDP: shards) summed over micro-batches as a binary tree
// (tree_sum.h: its partial sums), plus under FSDP the unsharded gradients of the unit in backward
// and of the previous one while its reduce-scatter runs: at most two units (fsdp.cpp waits for the
// previous unit's before issuing the next), the bound the plan counts; how much of the second is
// still held depends on how soon the engine sends it (measured: 0.1 to 0.7). Under PP the
// micro-batches' gradients are summed unsharded (pipeline_step.h): in place, one gradient per
// parameter; as a tree, the tree's partial sums. Under FSDP's zero3 (fsdp.h) each micro-batch's
// are reduce-scattered as without PP and summed into the shards, in place or as a tree; per step,
// FSDP reduce-scatters the unsharded sum once, at the step's end.
void gradient_terms(const PlanJob& j, RankPlan& r) {
  using C = PlanCategories;
  const bool fsdp = j.m.fsdp() > 1;
  const int trees = j.m.pp > 1 && !j.c.parallelism.pipeline_tree_sum() ? 1 : tree_sum_buffers(j.microbatches);
  const std::string tree = trees > 1 ? fmt::format(" x {} (tree sum over micro-batches)", trees) : "";
  double all_units = 0;
  for (const auto& [unit, bytes] : r.unit_grads) all_units += bytes;
  if (j.m.pp > 1 && (!fsdp || j.fsdp_per_step())) {
    r.term("gradients: f32 " + std::string(fsdp ? "unsharded gradients" : "gradients") + tree,
           (fsdp ? all_units : r.master * 4) * trees, &C::gradients);
    // A gradient no reduce-scatter divides (routed experts with no expert-FSDP group) is its own shard.
    if (fsdp) r.term("gradients: f32 shards (the step's reduce-scatter)", r.reduced_master * 4, &C::gradients);
  } else {
    r.term("gradients: f32 " + std::string(fsdp ? "shards" : "gradients") + tree, r.master * 4 * trees, &C::gradients);
    if (fsdp)
      r.term("gradients: unsharded, the unit in backward + the one reduce-scattering" +
                 std::string(j.streams > 1 ? " x 2 (an F&B pair's backward and the forward's held gradients)" : ""),
             2 * r.largest_unit_grads() * j.streams, &C::gradients);
    // Summed in place (zero3 under PP), a reduce-scatter's output waits outside the sum until it
    // is added: one unit's shard (under the tree it is the tree's leaf in progress, counted above).
    if (fsdp && j.m.pp > 1 && trees == 1)
      r.term("gradients: the reduce-scattered shard of the unit in flight, before it joins the sum",
             r.largest_unit_grads() / j.m.fsdp(), &C::gradients);
  }
}

// AdamW: two f32 moments of the masters. Muon: one f32 momentum buffer of its group's masters, two
// moments of AdamW's, and the step's working memory sized for the largest matrices (muon.h: the
// update matrix and Newton-Schulz's two iterates [m, n], its two [m, m], m the small side). Swapped, the
// chunk buffers as swapped_moments.cpp sizes them (chunks of whole 4 KiB pages of each array; two
// buffers, one when a chunk holds everything; each with a page of alignment slack), one set per
// file (Muon's momentum has a file of its own), and the state on disk.
void optimizer_terms(const PlanJob& j, RankPlan& r) {
  using C = PlanCategories;
  const bool muon = j.c.optimizer.name == OptimizerKind::muon;
  double muon_elems = 0, largest = 0, largest_gram = 0;
  if (muon)
    for (const Local& l : r.params) {
      if (!l.p->muon) continue;
      muon_elems += l.shard;
      const size_t n = l.p->shape.size();
      const double rows = double(l.p->shape[n - 2]), cols = double(l.p->shape[n - 1]);
      largest = std::max(largest, rows * cols);
      largest_gram = std::max(largest_gram, std::min(rows, cols) * std::min(rows, cols));
    }
  const double adamw_bytes = (r.master - muon_elems) * 8, muon_bytes = muon_elems * 4;
  r.state = adamw_bytes + muon_bytes;
  // Split matrices (muon.h's owner-compute, under FSDP and TP): the exchange buffers, this rank's
  // pieces of every split matrix and, whole, the matrices it owns (the rank owning the most).
  if (muon)
    for (const bool tp : {false, true}) {
      const plan::MuonSplit split = plan::muon_split(r.params, j.m, tp);
      if (split.shapes.empty()) continue;
      const std::vector<int> owners = optim::muon_owners(split.shapes, split.group);
      std::vector<double> owned(size_t(split.group), 0.0);
      for (size_t i = 0; i < split.shapes.size(); ++i)
        owned[size_t(owners[i])] += double(split.shapes[i].first * split.shapes[i].second);
      r.term(tp ? "optimizer: Muon under TP, exchange buffers (this rank's pieces + the matrices it owns)"
                : "optimizer: Muon under FSDP, exchange buffers (this rank's rows + the matrices it owns)",
             (split.pieces + *std::max_element(owned.begin(), owned.end())) * 4, &C::optimizer);
    }
  r.term("optimizer: Muon update matrix + Newton-Schulz scratch (f32, the largest matrices)",
         (3 * largest + 2 * largest_gram) * 4, &C::optimizer);
  if (j.c.optimizer.swap == OptimizerSwap::none) {
    r.term(muon ? "optimizer: AdamW exp_avg + exp_avg_sq of its group (f32)" : "optimizer: AdamW exp_avg + exp_avg_sq (f32)",
           adamw_bytes, &C::optimizer);
    r.term("optimizer: Muon momentum buffers (f32)", muon_bytes, &C::optimizer);
    return;
  }
  const double page = 4096;
  auto buffers = [&](double state, int arrays) {
    if (state <= 0) return 0.0;
    const double chunk = std::max(arrays * page, std::floor(double(j.c.optimizer.swap_chunk_mb) * (1 << 20) / (arrays * page)) *
                                                     arrays * page);
    return state > chunk ? 2 * (chunk + page) : std::ceil(state / (arrays * page)) * arrays * page + page;
  };
  r.term("optimizer: swap chunk buffers", buffers(adamw_bytes, 2) + buffers(muon_bytes, 1), &C::optimizer);
  r.swapped = adamw_bytes + muon_bytes;
}

// Zero-bubble schedules (ZB-V, DualPipeV) queue each linear layer's weight gradient at I and run
// it at W (autograd::DeferWeightGrads): its output gradient (tokens x output features, in the
// compute dtype) waits in between. The most a pipeline rank holds at once: its action list
// replayed, each (stage, micro-batch) from its I to its W holding the output gradients of its
// stage's linear layers (routed experts' grouped GEMMs compute theirs at I). The peak is either
// during a backward action (its activation gradients with what the earlier I's hold) or at the
// end of an I (its own output gradients held too, its activation gradients gone).
struct Deferred {
  double before = 0;  // the most held when a backward action (B or I) begins
  double after = 0;   // ... when an I ends
};
Deferred deferred_weight_grads(const PlanJob& j, const pp::Schedule& s, const std::vector<pp::StageLayers>& stages, int rank) {
  std::map<int, double> per_stage;  // bytes one micro-batch of the stage holds
  // DSA's fused kernels (model.converters dsa_fused) apply MLA's wkv_b inside attention (absorbed
  // into the queries and the output), not as a linear layer: its gradient is computed at I.
  const auto& conv = j.c.model.converters;
  const bool absorbed = std::find(conv.begin(), conv.end(), "dsa_fused") != conv.end();
  for (int st : s.stages_of(rank)) {
    const StagePart one{{stages[size_t(st)]}};
    double width = 0;
    for (const PlannedParam& p : j.model.params)
      if (p.gemm && !p.routed_expert && p.shape.size() == 2 && one.holds(p) && !(absorbed && p.name.ends_with(".wkv_b.weight")))
        width += double(p.shape[0]) / (p.tp_dim == 0 ? j.m.tp : 1);
    per_stage[st] = width * double(j.micro_tokens) * (j.bf16 ? 2 : 4);
  }
  double held = 0;
  Deferred most;
  for (const pp::Action& a : s.actions[size_t(rank)]) {
    if (a.op == pp::Op::backward || a.op == pp::Op::backward_input) most.before = std::max(most.before, held);
    if (a.op == pp::Op::backward_input) most.after = std::max(most.after, held += per_stage[a.stage]);
    if (a.op == pp::Op::backward_weight) held -= per_stage[a.stage];
  }
  return most;
}

// Activations of the micro-batches in flight (activation_plan.h) and the temporaries of one
// backward, plus the pipeline's buffers to and from the neighbouring stages and, under FSDP, the
// reduce-scatter receive buffers (every rank's piece of the f32 gradients, comm_engine.cpp): one
// unit's without PP, at most every unit's under PP.
void activation_terms(const PlanJob& j, const StagePart& part, double in_flight, const Deferred& deferred, RankPlan& r) {
  const ActivationModel m = activation_model(*j.model.family, j.query());
  std::vector<int> blocks = part.blocks();
  if (part.head())
    for (int d = 0; d < j.c.model.mtp_layers; ++d) blocks.push_back(int(j.model.n_layers) + d);
  const models::Recompute mode = j.c.activation_checkpoint.mode;
  const double tokens = double(j.micro_tokens);
  r.term(fmt::format("activations: {} tokens x {:g} micro-batch{} in flight, checkpointing {}", j.micro_tokens, in_flight,
                     in_flight != 1 ? "es" : "", name_of(mode)),
         activation_peak(m, blocks, part.embedding(), part.head(), mode) * tokens * in_flight, &PlanCategories::activations);
  const double pipe = j.m.pp > 1 ? 2 * double(j.model.stage_width) / j.m.tp * (j.bf16 ? 2 : 4) : 0;
  const double backward = (backward_temporaries(m, blocks, part.head(), mode) + pipe) * tokens;
  r.term("temporaries: activation gradients (the loss's or a block's backward)", backward, &PlanCategories::temporaries);
  r.term("temporaries: linear layers' output gradients waiting from I for their W (zero-bubble schedules)",
         std::max(deferred.after - backward, deferred.before), &PlanCategories::temporaries);
  // The engine receives every rank's piece of a reduce-scattered gradient before it sums them.
  // Without PP one unit's are in flight at a time, during the next unit's backward. Under PP the
  // step's end issues every unit's, one after the other, after the last backward: at most all of
  // them at once (the engine may finish early ones first), and only what exceeds the backward's adds.
  // Either way a routed expert with no expert-FSDP group sends nothing.
  double largest = 0, every = 0;
  for (const auto& [unit, bytes] : r.unit_reduced) largest = std::max(largest, bytes), every += bytes;
  if (j.fsdp_per_step())
    r.term("temporaries: every unit's reduce-scatter receive buffers at the step's end, beyond the backward's",
           every - backward, &PlanCategories::temporaries);
  else
    r.term("temporaries: a unit's reduce-scatter receive buffers", largest, &PlanCategories::temporaries);
}

// Checkpoints (checkpoint.h's write_shard, async_save.h): a save streams this rank's file (the
// masters and the optimizer state; swapped moments straight from the swap file) through one
// staging buffer of checkpoint.staging_mib, or the file's size when smaller; an async save also
// copies the model's buffers when it starts (the forward changes them). Nothing else: the writer
// reads the weights and the state in place, and the optimizer step waits for it.
void checkpoint_terms(const PlanJob& j, RankPlan& r) {
  if (!j.c.checkpoint.enable) return;
  const double file = r.master * 4 + r.state + j.model.buffer_bytes;
  r.term(fmt::format("temporaries: checkpoint staging buffer (checkpoint.staging_mib = {})", j.c.checkpoint.staging_mib),
         std::min(double(j.c.checkpoint.staging_mib) * (1 << 20), file), &PlanCategories::temporaries);
  if (j.c.checkpoint.async_mode == CheckpointAsyncMode::async)
    r.term("temporaries: async checkpoint's copy of the model's buffers", j.model.buffer_bytes, &PlanCategories::temporaries);
}

RankPlan plan_rank(const PlanJob& j, const StagePart& part, double in_flight, const Deferred& deferred) {
  RankPlan r;
  collect_params(j, part, r);
  parameter_terms(j, r);
  gradient_terms(j, r);
  optimizer_terms(j, r);
  activation_terms(j, part, in_flight, deferred, r);
  checkpoint_terms(j, r);
  return r;
}

}  // namespace

int64_t tokenizer_vocab(const JobConfig& c) {
  const std::string file = tokenizer_file(c);
  if (file.empty() || !std::filesystem::exists(file)) return 0;
  return data::Tokenizer::load(file).vocab_size();
}

PlanMesh plan_mesh(const JobConfig& c, int world, const std::string& source) {
  const Parallelism& p = c.parallelism;
  const auto d = distributed::resolve_mesh({p.pipeline_parallel_degree, p.data_parallel_replicate_degree,
                                            p.data_parallel_shard_degree, p.context_parallel_degree, p.tensor_parallel_degree},
                                           world, source);
  const bool expert_tp = p.experts_split_over_tp();
  distributed::check_expert_degree(d, p.expert_parallel_degree, source, expert_tp);
  return {world, d[0], d[1], d[2], d[3], d[4], int(p.expert_parallel_degree), expert_tp};
}

MemoryPlan plan_memory(const JobConfig& c, int world, int64_t vocab, const std::string& source) {
  check_supported(c, source);
  TITAN_CHECK(c.model.mtp_layers == 0 || models::model_family(c.model.name).multi_token_prediction,
              source + ": model.mtp_layers = " + std::to_string(c.model.mtp_layers) + ": model '" + c.model.name +
                  "' has no multi-token prediction",
              "set model.mtp_layers = 0");
  MemoryPlan plan;
  plan.mesh = plan_mesh(c, world, source);
  const PlanMesh& m = plan.mesh;
  plan.model = model_shape(c.model.name, c.model.flavor, vocab, c.training.seq_len, c.model.mtp_layers,
                           c.parallelism.experts_split_over_tp());
  plan.vocab = plan.model.vocab;
  for (const PlannedParam& p : plan.model.params) {
    plan.total_params += double(p.shape.numel());
    if (p.routed_expert) plan.expert_params += double(p.shape.numel());
  }
  PlanJob j{c, m, plan.model, c.training.mixed_precision_param == DType::bf16 && c.training.dtype == DType::f32};
  const int64_t seq_tokens = c.training.seq_len / m.cp;
  std::vector<StagePart> parts;
  std::vector<double> in_flight;
  std::vector<Deferred> deferred;  // per pipeline rank (none without PP)
  const int64_t accumulation = gradient_accumulation_steps(c, m.dp_replicate * m.dp_shard);
  if (m.pp > 1) {
    const PipelinePlan pipeline = plan_pipeline(c, plan.model.n_layers, 0, source);
    const pp::Schedule& s = pipeline.schedule;
    const pp::Simulation sim = pp::simulate(s, pp::Costs{{{1, 1, 1}}, 0});
    for (int r = 0; r < m.pp; ++r) {
      StagePart part;
      for (int st : s.stages_of(r)) part.stages.push_back(pipeline.stages[size_t(st)]);
      parts.push_back(part);
      // The simulator counts stage-sized forwards in flight; a rank of v stages holds v of them per
      // micro-batch, so 5 of them are 2.5 micro-batches of the rank's activations (not 2).
      in_flight.push_back(std::max(1.0, double(sim.peak_in_flight[size_t(r)]) / s.stages_per_rank));
    }
    j.micro_tokens = c.parallelism.pipeline_parallel_microbatch_size * seq_tokens;
    j.microbatches = s.microbatches * accumulation;  // the schedule runs once per accumulation step
    bool pairs = false;
    for (const auto& list : s.actions)
      for (const pp::Action& a : list) pairs = pairs || a.overlapped;
    if (pairs && c.parallelism.pipeline_parallel_expert_parallel_overlap && m.ep > 1) j.streams = 2;  // as PipelineStep runs them
    // Under FSDP per step the step's-end reduce-scatter buffers (all of a stage's gradients, after
    // the last W) already exceed what the W's held: not counted there.
    for (int r = 0; r < m.pp; ++r) deferred.push_back(j.fsdp_per_step() ? Deferred{} : deferred_weight_grads(j, s, pipeline.stages, r));
  } else {
    parts.push_back({{{0, int(plan.model.n_layers), true, true}}});
    in_flight.push_back(1.0);
    j.micro_tokens = c.training.local_batch_size * seq_tokens;
    j.microbatches = accumulation;
  }
  plan.accumulation = j.microbatches;
  RankPlan best;
  for (size_t r = 0; r < parts.size(); ++r) {
    RankPlan rp = plan_rank(j, parts[r], in_flight[r], deferred.empty() ? Deferred{} : deferred[r]);
    plan.pipeline_ranks.push_back({rp.peak, rp.terms});
    if (r == 0 || rp.peak.total() > best.peak.total()) {
      best = std::move(rp);
      plan.stage = int(r);
    }
  }
  plan.peak = best.peak;
  plan.terms = best.terms;
  plan.swapped_bytes = best.swapped;
  plan.non_expert_weights_grads_before_fsdp = best.non_expert_before_fsdp;
  plan.tp_whole_weights_grads_before_fsdp = best.tp_whole_before_fsdp;
  plan.traffic = plan::plan_traffic(j, best.params, parts[size_t(plan.stage)]);
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
    try {  // the degrees expert parallelism can borrow from (check_expert_degree)
      plan_mesh(grown, world, source);
    } catch (const Error&) {
      continue;
    }
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
                   p.tp_whole_weights_grads_before_fsdp > 0
                       ? fmt::format(" ({:.1f} GB of it computed whole on every TP rank, as DeepSeek-V3.2's lightning indexers)",
                                     p.tp_whole_weights_grads_before_fsdp / 1e9)
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
  j["tp_whole_weights_grads_before_fsdp"] = p.tp_whole_weights_grads_before_fsdp;
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
