// The parameters a model has, read from the model built without storage
// (nn::ParametersWithoutStorage): name, global shape, the block that holds it and how its
// declared parallel plan divides it (Parameter::tp_plan, routed_expert). The memory planner
// (memory_plan.h) sizes any flavor, 671B included, from it; it holds no copy of any model's
// structure.
#pragma once

#include <string>
#include <vector>

#include "titan/core/shape.h"
#include "titan/models/family.h"

namespace titan::train {

struct PlannedParam {
  std::string name;
  Shape shape;  // global; routed experts [E, ...]
  // The block that holds it: 0 .. n_layers - 1, or kEmbedding, kHead (final norm, output) and
  // kMtp (the MTP modules, which live with the head).
  int layer = 0;
  // The dimension tensor parallelism divides: 0 column-parallel (by heads or hidden units) and
  // vocabulary-parallel, 1 row-parallel (2: w2 of experts split by hidden units); -1 whole on
  // every TP rank (norms, MLA's down-projections, routers, the indexer, experts under the fix).
  int tp_dim = -1;
  bool tp_partial_grad = false;  // whole on every TP rank, each rank's gradient a partial sum
  bool routed_expert = false;    // divided over expert parallelism (dim 0, the experts)
  bool gemm = false;             // read by a GEMM: has a bf16 compute copy under mixed precision
  bool muon = false;             // in Muon's group under [optimizer] name = "Muon" (optim/param_groups.h)
  static constexpr int kEmbedding = -1, kHead = 1 << 20, kMtp = (1 << 20) + 1;
};

struct ModelShape {
  const models::ModelFamily* family = nullptr;
  int64_t n_layers = 0;
  int64_t dim = 0, vocab = 0;
  // Values per token of the activation between pipeline stages: dim, or DeepSeek-V4's hc_mult
  // residual streams of dim each.
  int64_t stage_width = 0;
  std::vector<PlannedParam> params;
  // What the build allocates besides the parameters, whole on every rank (category parameters):
  // RoPE tables, MoE routing buffers.
  double buffer_bytes = 0;
};

// `vocab` <= 0: the flavor's own vocabulary. seq_len: the training sequence (the RoPE tables cover
// at least it). mtp_layers: [model] mtp_layers. moe_tp_gather: TorchTitan's MoE TP scheme (every
// expert's hidden units split) instead of the fix.
ModelShape model_shape(const std::string& model, const std::string& flavor, int64_t vocab, int64_t seq_len = 0,
                       int64_t mtp_layers = 0, bool moe_tp_gather = false);

}  // namespace titan::train
