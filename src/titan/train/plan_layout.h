// The memory planner's view of one rank (memory_plan.cpp, comm_plan.cpp): which parameters it
// holds and how much of each, after the TP, EP, FSDP and PP plans have divided them.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "titan/distributed/pipeline_stages.h"
#include "titan/train/config.h"
#include "titan/train/memory_plan.h"
#include "titan/train/param_inventory.h"

namespace titan::train::plan {

inline constexpr int kRootUnit = -2;  // FSDP's root unit (the final norm): gathered for the whole step

// The job as the planner reads it.
struct PlanJob {
  const JobConfig& c;
  PlanMesh m;
  ModelShape model;
  bool bf16 = false;
  int64_t micro_tokens = 0;  // tokens of one micro-batch on one rank (CP's share)
  int64_t microbatches = 1;  // per step on this rank (accumulation times the pipeline's)
  // Pieces of work a rank runs at once: 2 when DualPipeV's F&B pairs run as compute pairs (a
  // forward and a backward taking turns at expert all-to-alls: both hold their FSDP units).
  int streams = 1;
  // Under PP, FSDP the old way (distributed/fsdp.h's per_step): units gathered and gradients
  // unsharded through the step, one reduce-scatter at its end. Else FSDP works per micro-batch.
  bool fsdp_per_step() const { return m.pp > 1 && c.parallelism.pipeline_parallel_fsdp == PipelineFsdp::per_step; }
  // The job as the model's family is asked about it (activations, routing, CP traffic).
  models::PlanQuery query() const {
    return {c.model.flavor, model.vocab, c.training.seq_len, c.dsa.topk, c.model.mtp_layers, m.tp, m.cp, bf16,
            c.parallelism.experts_split_over_tp()};
  }
};

// Routed experts under expert parallelism: divided over EP, sharded over the expert-FSDP group.
inline bool is_expert(const PlannedParam& p, const PlanMesh& m) { return p.routed_expert && m.ep > 1; }

// One parameter as a rank holds it.
struct Local {
  const PlannedParam* p;
  double elems = 0;     // this rank's piece before FSDP (after TP and EP)
  double shard = 0;     // what FSDP leaves it (rows padded), or elems without FSDP
  double gathered = 0;  // FSDP: the unsharded piece, rows padded (elems without FSDP)
  int unit = 0;         // FSDP unit, keys in the order the units run: embedding, blocks, MTP, head; or kRootUnit
};

inline Local local_param(const PlannedParam& p, const PlanMesh& m) {
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
  l.unit = p.name == "norm.weight"        ? kRootUnit
           : p.name.starts_with("mtp.") ? PlannedParam::kHead - 1024 + std::stoi(p.name.substr(4))
                                          : p.layer;
  return l;
}

// Muon's split matrices (optim/muon.h) among a rank's parameters, for one of its two exchanges:
// the tensor-parallel ones (tp: gathered over dp_shard x cp x tp) or those FSDP alone splits (over
// dp_shard x cp). Each matrix's shape, this rank's pieces' elements, and the mean elements one rank
// sends per step, both ways: 2 (h - 1) / h of its pieces, h the ranks holding one matrix (the
// group, or TP's ranks for experts split over TP, whose FSDP rows are whole experts). The group
// of one (no split) has none.
struct MuonSplit {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  double pieces = 0, sent = 0;
  int group = 1;
};
inline MuonSplit muon_split(const std::vector<Local>& params, const PlanMesh& m, bool tp) {
  MuonSplit out;
  out.group = tp ? (m.tp > 1 ? m.fsdp() * m.tp : 1) : m.fsdp();
  if (out.group == 1) return out;
  for (const Local& l : params) {
    const PlannedParam& p = *l.p;
    const bool tp_split = m.tp > 1 && p.tp_dim >= 0;
    if (!p.muon || tp_split != tp || (p.shape.size() == 3 && !tp_split)) continue;  // experts on dim 0: whole
    const size_t n = p.shape.size();
    const int64_t rows = p.shape[n - 2], cols = p.shape[n - 1];
    const int64_t count = n == 3 ? int64_t(l.elems * m.tp / double(rows * cols)) : 1;  // this rank's experts
    for (int64_t e = 0; e < count; ++e) out.shapes.emplace_back(rows, cols);
    const double holders = n == 3 ? m.tp : out.group;
    out.pieces += l.shard;
    out.sent += 2 * (holders - 1) / holders * l.shard;
  }
  return out;
}

// What one pipeline rank (or, without PP, the whole model) holds.
struct StagePart {
  std::vector<distributed::pp::StageLayers> stages;  // the rank's stages
  bool holds(const PlannedParam& p) const {
    for (const distributed::pp::StageLayers& st : stages) {
      if (p.layer == PlannedParam::kEmbedding && st.embedding) return true;
      if (p.layer >= PlannedParam::kHead && st.head) return true;
      if (p.layer >= st.begin && p.layer < st.end) return true;
    }
    return false;
  }
  std::vector<int> blocks() const {
    std::vector<int> ids;
    for (const distributed::pp::StageLayers& st : stages)
      for (int l = st.begin; l < st.end; ++l) ids.push_back(l);
    return ids;
  }
  bool embedding() const { return std::any_of(stages.begin(), stages.end(), [](auto& s) { return s.embedding; }); }
  bool head() const { return std::any_of(stages.begin(), stages.end(), [](auto& s) { return s.head; }); }
};

}  // namespace titan::train::plan
