// Async tensor parallelism (TorchTitan's parallelism.enable_async_tensor_parallel; Megatron-LM's
// TP communication overlap): the sequence-parallel collectives around a block's projections run
// while the projections' GEMMs do, instead of before or after them.
//   gathered_linears = gather_tokens(x), then the column-parallel projections x_all W_i^T. Forward:
//     the all-gather is issued, this rank's own piece is multiplied while the others arrive, then
//     theirs. Backward: dX_all = sum_i dY_i W_i first, its reduce-scatter issued, and the weight
//     gradients dY_i^T x_all computed while it travels.
//   linear_reduce_scatter = the row-parallel projection x W^T, then reduce_scatter_tokens, in
//     column blocks: a block's reduce-scatter travels while the next block is multiplied.
//     Backward: the gradient's blocks are all-gathered, each block's dX and dW products running
//     while the next block arrives.
// Bytes and results equal the synchronous ops' (each output element is the same dot product and
// the same reduction). On a group of one rank they are the plain projections.
#pragma once

#include <vector>

#include "titan/autograd/variable.h"
#include "titan/distributed/process_group.h"
#include "titan/nn/layers.h"

namespace titan::distributed {

// x [n, D] (this rank's sequence piece) -> [tp n, out_i] = gather_tokens(x) W_i^T for each layer.
// gathered (optional): set to the gathered tokens [tp n, D], for readers that take no gradient
// back through them (DeepSeek-V3.2's indexer reads the attention's input detached).
std::vector<autograd::Variable> gathered_linears(const autograd::Variable& x, const std::vector<const nn::Linear*>& layers,
                                                 const ProcessGroup& tp, Tensor* gathered = nullptr);

// x [tp n, in] (every token, this rank's heads or FFN columns) -> reduce_scatter_tokens(x W^T), [n, out].
autograd::Variable linear_reduce_scatter(const autograd::Variable& x, const nn::Linear& layer, const ProcessGroup& tp);

// A model's tensor-parallel projections, synchronous or asynchronous by a flag (tp null: no TP,
// the plain projections of x). column_parallel: gather_tokens(x) then the projections, or
// gathered_linears (gathered as there; x itself without TP); row_parallel: the projection then
// reduce_scatter_tokens, or linear_reduce_scatter.
std::vector<autograd::Variable> column_parallel(const autograd::Variable& x, const std::vector<const nn::Linear*>& layers,
                                                const ProcessGroup* tp, bool async, Tensor* gathered = nullptr);
autograd::Variable row_parallel(const autograd::Variable& x, const nn::Linear& layer, const ProcessGroup* tp, bool async);

}  // namespace titan::distributed
