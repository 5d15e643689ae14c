// The parameters a model would have, from its flavor alone: name, global shape, the block that
// holds it and how the parallel plans divide it (models/<model>/parallelize.cpp), without
// building the model. The memory planner (memory_plan.h) sizes any flavor, 671B included, from
// it; a unit test holds it equal to the built debug models' named_parameters().
#pragma once

#include <string>
#include <vector>

#include "titan/core/shape.h"

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
  bool routed_expert = false;  // divided over expert parallelism (dim 0, the experts)
  bool gemm = false;           // read by a GEMM: has a bf16 compute copy under mixed precision
  static constexpr int kEmbedding = -1, kHead = 1 << 20, kMtp = (1 << 20) + 1;
};

struct ModelShape {
  std::string model;       // llama3, deepseek_v3, deepseek_v32
  int64_t n_layers = 0;
  int64_t dim = 0, vocab = 0;
  std::vector<PlannedParam> params;
  double rope_table_bytes = 0;  // the RoPE cos / sin tables every rank holds (category parameters)
};

// `vocab` <= 0: the flavor's own vocabulary. seq_len: the training sequence (the RoPE tables cover
// at least it). mtp_layers: deepseek_v3's [model] mtp_layers. moe_tp_gather: TorchTitan's MoE TP
// scheme (every expert's hidden units split) instead of the fix.
ModelShape model_shape(const std::string& model, const std::string& flavor, int64_t vocab, int64_t seq_len = 0,
                       int64_t mtp_layers = 0, bool moe_tp_gather = false);

}  // namespace titan::train
