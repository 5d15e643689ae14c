// The memory and communication plan of a training job, computed from its config alone: per-rank
// bytes by allocator category (what the trainer's peak_memory_bytes reports) and the bytes each
// collective sends per step, for any flavor (671B included) on any mesh, without building the
// model. `titan plan --config` prints it; the tests hold it to measured peaks of real runs.
//
// What each category holds (memory_plan.cpp and activation_plan.cpp derive each term; docs/memory.md
// explains them):
//   parameters   f32 masters (FSDP: this rank's shards, rows padded to the shard group), bf16
//                compute copies under mixed precision (FSDP: none kept, the bf16 shards of the
//                units being gathered), FSDP units gathered at once (the one
//                running and the one prefetched; under PP with FSDP per step every unit of the
//                stage stays gathered)
//   gradients    f32, the masters' size (FSDP: shards, plus at most two units unsharded); with
//                micro-batches, the binary tree sum's partial sums (tree_sum.h); under PP with
//                FSDP per step (or no FSDP) the stage's unsharded gradients, once in place or as
//                the tree's partial sums
//   optimizer    AdamW's two f32 moments of the masters; under Muon one f32 buffer of its matrices,
//                the step's scratch and, under FSDP, the exchange buffers; swapped: two chunk
//                buffers per file (the rest on disk)
//   activations  what forward keeps for backward, per activation-checkpointing mode, times the
//                micro-batches a pipeline rank holds at once
//   temporaries  gradients of activations in backward and the logits' gradient; a checkpoint
//                save's staging buffer (checkpoint.staging_mib) and an async save's copy of the
//                model's buffers
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/train/config.h"
#include "titan/train/param_inventory.h"

namespace titan::train {

struct PlanMesh {
  int world = 1, pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, ep = 1;
  bool expert_tp = false;  // routed experts split over TP (moe_tp_scheme "gather"): EP borrows no TP ranks
  int fsdp() const { return dp_shard * cp; }  // shards non-expert parameters
  int efsdp() const { return dp_shard * cp * (expert_tp ? 1 : tp) / ep; }  // shards routed experts (with EP)
};

struct PlanCategories {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, temporaries = 0;
  double total() const { return parameters + gradients + optimizer + activations + temporaries; }
};

struct PlanCollective {
  std::string group;  // mesh dimension(s): "fsdp", "dp_replicate", "tp", "ep", "cp", "pp"
  std::string op;     // all_gather, reduce_scatter, all_reduce, all_to_all, send
  double bytes = 0;   // sent by one rank per optimizer step
  std::string what;
};

struct MemoryPlan {
  PlanMesh mesh;
  int64_t vocab = 0;
  ModelShape model;
  double total_params = 0, expert_params = 0;  // the whole model
  int64_t accumulation = 1;                    // micro-batches per step (gradient accumulation or PP)
  // The busiest rank (the pipeline stage holding the most): its peak by category, the terms
  // behind it, and the optimizer state kept on disk under [optimizer] swap = "file".
  int stage = 0;
  PlanCategories peak;
  std::vector<std::pair<std::string, double>> terms;  // ("category: what", bytes)
  double swapped_bytes = 0;
  // Per rank of the busiest stage, before FSDP divides anything: the f32 weights + gradients of
  // everything but the routed experts (the seed's "non-MoE weights + gradients per card").
  double non_expert_weights_grads_before_fsdp = 0;
  double tp_whole_weights_grads_before_fsdp = 0;  // the part of it computed whole on every TP rank
  std::vector<PlanCollective> traffic;
  // Every pipeline rank's peaks and terms (one entry without PP), for comparing with metrics that
  // report each category's largest peak over the ranks.
  struct Rank {
    PlanCategories peak;
    std::vector<std::pair<std::string, double>> terms;
  };
  std::vector<Rank> pipeline_ranks;
};

// The mesh a config asks for on `world` ranks (dp_shard = -1 resolved); throws as the trainer does
// when it does not divide the world.
PlanMesh plan_mesh(const JobConfig& c, int world, const std::string& source);

// The vocabulary of the tokenizer the config names (model.tokenizer_path, or tokenizer.json in
// model.hf_assets_path) when the file exists, else 0.
int64_t tokenizer_vocab(const JobConfig& c);

// `vocab` <= 0: the flavor's own vocabulary (the tokenizer's is what a run uses).
MemoryPlan plan_memory(const JobConfig& c, int world, int64_t vocab, const std::string& source);

// The smallest world size (the mesh's other degrees as configured, dp_shard grown) whose busiest
// rank's peak fits in `device_bytes`; 0 when none up to max_world does.
int smallest_world(const JobConfig& c, int64_t vocab, double device_bytes, const std::string& source,
                   int max_world = 1 << 16);

// The plan as text: mesh, per-category bytes with their terms, traffic per collective.
std::string plan_str(const MemoryPlan& p);
// The same as JSON: {"mesh": {...}, "peak": {category: bytes}, "terms": {...}, "traffic": [...], ...}.
nlohmann::json plan_json(const MemoryPlan& p);

}  // namespace titan::train
