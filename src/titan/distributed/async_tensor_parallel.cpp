#include "titan/distributed/async_tensor_parallel.h"

#include <string>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/matmul.h"

namespace titan::distributed {

using autograd::GradSink;
using autograd::Variable;

namespace {

// The weight a projection multiplies by: its compute copy under mixed precision, else the master.
Tensor compute_weight(const nn::Linear& l) {
  return l.weight.compute.defined() ? l.weight.compute : l.weight.var.value();
}

Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

// Rows [from, from + n) of a contiguous [rows, cols] tensor: a contiguous view.
Tensor rows(const Tensor& t, int64_t from, int64_t n) { return t.slice(0, from, from + n); }

void give_gradient(GradSink& g, size_t i, const Tensor& value) {
  if (!g.needs(i) || g.adopt(i, value)) return;
  Tensor d = g.grad(i);
  kernels::axpby(d, value, 1.0, 1.0);
}

// Column blocks of a row-parallel output: two when the width splits evenly (one block's
// reduce-scatter then travels while the other is multiplied), else one.
int64_t column_blocks(int64_t out) { return out % 2 == 0 ? 2 : 1; }

}  // namespace

std::vector<Variable> gathered_linears(const Variable& x, const std::vector<const nn::Linear*>& layers,
                                       const ProcessGroup& tp, Tensor* gathered) {
  std::vector<Variable> out;
  if (tp.size() == 1) {
    for (const nn::Linear* l : layers) out.push_back(l->forward(x));
    if (gathered) *gathered = x.value();
    return out;
  }
  ProfileScope prof("tp.async.gathered_linears.fwd");
  const Tensor xv = x.value().contiguous();
  TITAN_CHECK(xv.dim() == 2, "gathered_linears: x must be [tokens, D], got " + xv.str());
  const int64_t n = xv.size(0), d = xv.size(1), t = tp.size(), r = tp.rank();
  std::vector<Tensor> weights;
  std::vector<Variable> inputs = {x};
  for (const nn::Linear* l : layers) {
    weights.push_back(compute_weight(*l));
    inputs.push_back(l->weight.var);
  }
  // [x_all, y_0, y_1, ...]; kept under selective activation checkpointing.
  const std::vector<Tensor> kept = autograd::keep_or_compute([&] {
    std::vector<Tensor> result = {Tensor::empty({t * n, d}, xv.dtype(), MemCategory::activations)};
    const Work gathering = tp.all_gather(flat(result[0]), flat(xv));
    for (const Tensor& w : weights) {
      result.push_back(Tensor::empty({t * n, w.size(0)}, xv.dtype(), MemCategory::activations));
      Tensor own = rows(result.back(), r * n, n);
      kernels::linear_forward(own, xv, w);  // while the other pieces arrive
    }
    gathering.wait();
    for (int64_t j = 0; j < t; ++j) {
      if (j == r) continue;
      const Tensor theirs = rows(result[0], j * n, n);
      for (size_t i = 0; i < weights.size(); ++i) {
        Tensor y = rows(result[i + 1], j * n, n);
        kernels::linear_forward(y, theirs, weights[i]);
      }
    }
    return result;
  });
  const Tensor x_all = kept[0];
  if (gathered) *gathered = x_all;
  const std::vector<Tensor> ys(kept.begin() + 1, kept.end());
  return autograd::record("tp.async.gathered_linears", inputs, ys,
                          [x_all, weights, &tp, n](std::span<const Tensor> dys, GradSink& g) {
    ProfileScope prof_bwd("tp.async.gathered_linears.bwd");
    // dX_all = sum_i dY_i W_i, reduce-scattered while the weight gradients are computed.
    Tensor dx_all;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (!dys[i].defined()) continue;
      const bool first = !dx_all.defined();
      if (first) dx_all = Tensor::empty(x_all.shape(), x_all.dtype());
      Tensor none;
      kernels::linear_backward(dx_all, none, none, dys[i].contiguous(), x_all, weights[i], !first, true);
    }
    Tensor dx;
    Work scattering;
    if (dx_all.defined()) {
      dx = Tensor::empty({n, x_all.size(1)}, x_all.dtype(), MemCategory::temporaries);
      scattering = tp.reduce_scatter(flat(dx), flat(dx_all));
    }
    for (size_t i = 0; i < weights.size(); ++i) {
      if (!dys[i].defined() || !g.needs(i + 1)) continue;
      bool accumulate = true;
      Tensor dw = g.grad_to_write(i + 1, &accumulate), none;
      kernels::linear_backward(none, dw, none, dys[i].contiguous(), x_all, weights[i], true, accumulate);
    }
    if (!dx.defined()) return;
    scattering.wait();
    give_gradient(g, 0, dx);
  });
}

Variable linear_reduce_scatter(const Variable& x, const nn::Linear& layer, const ProcessGroup& tp) {
  if (tp.size() == 1) return layer.forward(x);
  ProfileScope prof("tp.async.linear_reduce_scatter.fwd");
  const Tensor xv = x.value().contiguous();
  const Tensor w = compute_weight(layer);
  TITAN_CHECK(xv.dim() == 2 && xv.size(0) % tp.size() == 0,
              "linear_reduce_scatter: x must be [tokens, in] with tokens a multiple of " + std::to_string(tp.size()) +
                  ", got " + xv.str(),
              "make local_batch_size x seq_len a multiple of tensor_parallel_degree");
  const int64_t n = xv.size(0) / tp.size(), out = w.size(0), blocks = column_blocks(out), width = out / blocks;
  const Tensor y = autograd::keep_or_compute([&] {
    Tensor piece = Tensor::empty({n, out}, xv.dtype(), MemCategory::activations);
    std::vector<Tensor> mine;
    std::vector<Work> scattering;
    for (int64_t b = 0; b < blocks; ++b) {  // block b's reduce-scatter travels while b + 1 is multiplied
      Tensor partial = Tensor::empty({xv.size(0), width}, xv.dtype());
      kernels::linear_forward(partial, xv, rows(w, b * width, width));
      mine.push_back(Tensor::empty({n, width}, xv.dtype()));
      scattering.push_back(tp.reduce_scatter(flat(mine.back()), flat(partial)));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      scattering[size_t(b)].wait();
      kernels::copy_columns(piece, b * width, mine[size_t(b)], 0, width);
    }
    return std::vector<Tensor>{piece};
  })[0];
  return autograd::record("tp.async.linear_reduce_scatter", {x, layer.weight.var}, y,
                          [xv, w, &tp, n, blocks, width](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("tp.async.linear_reduce_scatter.bwd");
    const Tensor d = dy.contiguous();
    std::vector<Tensor> gathered;
    std::vector<Work> gathering;
    for (int64_t b = 0; b < blocks; ++b) {  // every block's all-gather issued at once
      Tensor mine = Tensor::empty({n, width}, d.dtype());
      kernels::copy_columns(mine, 0, d, b * width, width);
      gathered.push_back(Tensor::empty({xv.size(0), width}, d.dtype()));
      gathering.push_back(tp.all_gather(flat(gathered.back()), flat(mine)));
    }
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), none;
    for (int64_t b = 0; b < blocks; ++b) {  // block b's products run while b + 1 arrives
      gathering[size_t(b)].wait();
      Tensor dw_rows = dw.defined() ? rows(dw, b * width, width) : Tensor();
      kernels::linear_backward(dx, dw_rows, none, gathered[size_t(b)], xv, rows(w, b * width, width),
                               accumulate_dx || b > 0, accumulate_dw);
    }
  });
}

std::vector<Variable> column_parallel(const Variable& x, const std::vector<const nn::Linear*>& layers,
                                      const ProcessGroup* tp, bool async, Tensor* gathered) {
  if (tp && async) return gathered_linears(x, layers, *tp, gathered);
  const Variable xs = tp ? gather_tokens(x, *tp) : x;
  if (gathered) *gathered = xs.value();
  std::vector<Variable> out;
  for (const nn::Linear* l : layers) out.push_back(l->forward(xs));
  return out;
}

Variable row_parallel(const Variable& x, const nn::Linear& layer, const ProcessGroup* tp, bool async) {
  if (tp && async) return linear_reduce_scatter(x, layer, *tp);
  const Variable y = layer.forward(x);
  return tp ? reduce_scatter_tokens(y, *tp) : y;
}

}  // namespace titan::distributed
