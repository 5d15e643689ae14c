// Tensor + sequence parallelism (Megatron-LM's, and TorchTitan's parallel styles): the
// communication a model's plan (models/<model>/parallelize.cpp) places between its layers, as
// autograd ops, and the placement of its parameters.
//
// The residual stream between blocks is sequence-parallel: of a micro-batch's N = B*S tokens
// (flattened, batch-major), TP rank r holds the r-th of tp consecutive pieces, [N/tp, D]. Norms
// and residual adds run on that piece alone. A block's attention or FFN first gathers the
// whole [N, D] (gather_tokens), runs its column-parallel projections (this rank's heads or FFN
// columns) and its row-parallel output projection, whose partial sums reduce_scatter_tokens
// adds up and hands back as sequence pieces. Per block and micro-batch: 2 all-gathers and 2
// reduce-scatters of N*D forward, the mirror in backward (reference/distributed.md section 3).
//
// The embedding is vocabulary-parallel (rank r holds rows [r V/tp, (r+1) V/tp) of the table),
// the output head column-parallel, and the loss is computed on the vocabulary-sharded logits
// (loss parallel), never gathering them.
//
// Every op is the identity (or the plain op) on a group of one rank.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "titan/autograd/variable.h"
#include "titan/distributed/process_group.h"
#include "titan/nn/module.h"

namespace titan::distributed {

using autograd::Variable;

// ---- a model's plan

// Throws unless `degree` divides every size in `splits` ({"attention heads", 16}, ...) of `model`,
// naming the first it does not divide, all of them, and the degrees that would divide them all.
// `hint_tail` is added to the hint (e.g. how to change the vocabulary).
void check_tensor_parallel_degree(int64_t degree, const std::string& model,
                                  const std::vector<std::pair<std::string, int64_t>>& splits,
                                  const std::string& hint_tail = "");

// ---- parameter placements (a model's plan calls these right after declaring its parameters
// whole, at any degree: each records the plan in Parameter::tp_plan, which the memory planner
// reads, and a group of more than one rank (tp; null: none) also places the parameter)

// `p`, declared whole, becomes piece tp.rank() of tp.size() equal pieces along `dim`
// (column-parallel: dim 0 of a Linear's [out, in] weight; row-parallel: dim 1; the vocabulary
// rows of an embedding): its shape, initial values and checkpoint slices are that piece's
// (nn::divide_parameter). The layers read their local sizes (heads, hidden units) from it.
void shard_parameter(nn::Parameter& p, int dim, const ProcessGroup* tp);
// Every TP rank holds `p` whole (its slice, if any, is not over TP). partial_grad: each rank's
// gradient is a partial sum (a sequence-parallel norm's), summed over TP by
// sum_partial_gradients after backward.
void replicate_parameter(nn::Parameter& p, const ProcessGroup* tp, bool partial_grad);

// ---- communication between layers (autograd ops)

// x [n, ...] (this rank's tokens) -> [tp * n, ...] (every rank's, in rank order): all-gather.
// Backward: the gradient's reduce-scatter (each rank's consumers saw all tokens).
Variable gather_tokens(const Variable& x, const ProcessGroup& tp);
// x [tp * n, ...] (this rank's partial sums over all tokens) -> [n, ...] (the sums of this
// rank's tokens): reduce-scatter. Backward: the gradient's all-gather.
Variable reduce_scatter_tokens(const Variable& x, const ProcessGroup& tp);

// Vocabulary-parallel embedding: ids [N] (i32, global token ids), table [V / tp, D] f32 (this
// rank's rows, shard_parameter dim 0) -> this rank's sequence piece [N / tp, D] in `dtype`: each
// rank looks up the ids it owns (zero rows elsewhere) and the pieces are reduce-scattered.
Variable embedding_vocab_parallel(const Tensor& ids, const Variable& table, DType dtype, const ProcessGroup& tp);

// Loss parallel: the mean cross-entropy over tokens whose target is not -100, from the logits of
// this rank's vocabulary slice, logits [N, V / tp] (f32 or bf16; slice r holds classes
// [r V/tp, (r+1) V/tp)), targets [N] i32 (global ids). Forward: 3 all-reduces of N floats (row
// max, then the sum of exponentials and the target's logit in one call); backward: none, each
// rank writes its slice of softmax - onehot. Returns a one-element f32 Variable, equal on every
// TP rank.
Variable cross_entropy_vocab_parallel(const Variable& logits, const Tensor& targets, const ProcessGroup& tp);

// ---- after backward

// Sums over TP the gradients of `params` marked tp_partial_grad (one all-reduce each, issued
// together), so every TP rank holds the whole gradient of a replicated parameter.
void sum_partial_gradients(const std::vector<nn::TrainableParam>& params, const ProcessGroup& tp);

}  // namespace titan::distributed
