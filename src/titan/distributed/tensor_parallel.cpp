#include "titan/distributed/tensor_parallel.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <limits>

#include "titan/core/error.h"
#include "titan/core/parallel.h"
#include "titan/core/profiler.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/embedding.h"

namespace titan::distributed {

using autograd::GradSink;

namespace {

Tensor activation(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, MemCategory::activations); }

Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[0] = rows;
  return out;
}

// g's gradient slot for input 0 receives `value` (adopted when it has none yet, else added).
void give_gradient(GradSink& g, const Tensor& value) {
  if (g.adopt(0, value)) return;
  Tensor dx = g.grad(0);
  kernels::axpby(dx, value, 1.0, 1.0);
}

Tensor all_gathered(const Tensor& x, const ProcessGroup& tp) {
  const Tensor in = x.contiguous();
  Tensor out = activation(with_rows(in.shape(), in.size(0) * tp.size()), in.dtype());
  tp.all_gather(out, in).wait();
  return out;
}

Tensor reduce_scattered(const Tensor& x, const ProcessGroup& tp) {
  const Tensor in = x.contiguous();
  Tensor out = activation(with_rows(in.shape(), in.size(0) / tp.size()), in.dtype());
  tp.reduce_scatter(out, in).wait();
  return out;
}

void check_token_split(const Tensor& x, const ProcessGroup& tp, const char* op) {
  TITAN_CHECK(x.dim() >= 1 && x.size(0) % tp.size() == 0,
              std::string(op) + ": " + std::to_string(x.size(0)) + " tokens do not split over " +
                  std::to_string(tp.size()) + " tensor-parallel ranks",
              "make local_batch_size x seq_len a multiple of tensor_parallel_degree");
}

float load(const void* p, DType dt, int64_t i) {
  return dt == DType::bf16 ? bf16_to_f32(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
void store(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::bf16) static_cast<bf16*>(p)[i] = f32_to_bf16(v);
  else static_cast<float*>(p)[i] = v;
}

}  // namespace

void check_tensor_parallel_degree(int64_t degree, const std::string& model,
                                  const std::vector<std::pair<std::string, int64_t>>& splits, const std::string& hint_tail) {
  TITAN_CHECK(degree >= 1, "parallelism.tensor_parallel_degree = " + std::to_string(degree) + " is not a degree",
              "use 1 or more");
  int64_t common = 0;
  std::string sizes;
  for (const auto& [what, n] : splits) {
    common = std::gcd(common, n);
    sizes += (sizes.empty() ? "" : ", ") + what + " (" + std::to_string(n) + ")";
  }
  for (const auto& [what, n] : splits) {
    if (n % degree == 0) continue;
    std::string works;
    for (int64_t d = 1; d <= common; ++d)
      if (common % d == 0) works += (works.empty() ? "" : ", ") + std::to_string(d);
    TITAN_FAIL("parallelism.tensor_parallel_degree = " + std::to_string(degree) + " does not divide " + model + "'s " +
                   std::to_string(n) + " " + what,
               "use a degree that divides the " + sizes + ": " + works + hint_tail);
  }
}

void shard_parameter(nn::Parameter& p, int dim, const ProcessGroup* tp) {
  const Shape whole = p.var.shape();
  TITAN_CHECK(dim >= 0 && dim < int(whole.size()), "shard_parameter: dim " + std::to_string(dim) + " of " + whole.str());
  p.tp_plan = {dim, false};
  p.tp_partial_grad = false;
  p.tp_duplicate = false;
  if (tp && tp->size() > 1) nn::divide_parameter(p, dim, tp->size(), tp->rank());  // composes with EP's slice
}

void replicate_parameter(nn::Parameter& p, const ProcessGroup* tp, bool partial_grad) {
  p.tp_plan = {-1, partial_grad};
  p.tp_partial_grad = partial_grad && tp && tp->size() > 1;
  p.tp_duplicate = tp && tp->rank() != 0;
}

Variable gather_tokens(const Variable& x, const ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  ProfileScope prof("tp.gather_tokens.fwd");
  return autograd::record("tp.gather_tokens", {x}, all_gathered(x.value(), tp), [&tp](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("tp.gather_tokens.bwd");
    give_gradient(g, reduce_scattered(dy, tp));
  });
}

Variable reduce_scatter_tokens(const Variable& x, const ProcessGroup& tp) {
  if (tp.size() == 1) return x;
  ProfileScope prof("tp.reduce_scatter_tokens.fwd");
  check_token_split(x.value(), tp, "reduce_scatter_tokens");
  return autograd::record("tp.reduce_scatter_tokens", {x}, reduce_scattered(x.value(), tp),
                          [&tp](const Tensor& dy, GradSink& g) {
                            ProfileScope prof_bwd("tp.reduce_scatter_tokens.bwd");
                            give_gradient(g, all_gathered(dy, tp));
                          });
}

Variable embedding_vocab_parallel(const Tensor& ids, const Variable& table, DType dtype, const ProcessGroup& tp) {
  ProfileScope prof("tp.embedding.fwd");
  const Tensor ids_flat = ids.contiguous().view({ids.numel()});
  check_token_split(ids_flat, tp, "embedding_vocab_parallel");
  const Tensor& tv = table.value();
  const int64_t n = ids_flat.numel(), rows = tv.size(0), dim = tv.size(1), first = rows * tp.rank();
  // This rank's ids, as rows of its table, and the tokens they sit at: rows [n_own, D] are looked
  // up, the others stay zero.
  std::vector<int64_t> own;
  const int32_t* id = ids_flat.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (id[i] >= first && id[i] < first + rows) own.push_back(i);
  Tensor local_ids = Tensor::empty({int64_t(own.size())}, DType::i32);
  for (size_t k = 0; k < own.size(); ++k) local_ids.data<int32_t>()[k] = int32_t(id[own[k]] - first);
  Tensor looked_up = Tensor::empty({int64_t(own.size()), dim}, dtype);
  kernels::embedding_forward(looked_up, tv, local_ids);
  Tensor partial = Tensor::zeros({n, dim}, dtype);
  const size_t row_bytes = size_t(dim) * size_t(dtype_bits(dtype) / 8);
  for (size_t k = 0; k < own.size(); ++k)
    std::memcpy(static_cast<char*>(partial.data_ptr()) + size_t(own[k]) * row_bytes,
                static_cast<const char*>(looked_up.data_ptr()) + k * row_bytes, row_bytes);
  Tensor y = tp.size() == 1 ? partial : reduce_scattered(partial, tp);
  return autograd::record("tp.embedding", {table}, y,
                          [&tp, own = std::move(own), local_ids, row_bytes](const Tensor& dy, GradSink& g) {
                            ProfileScope prof_bwd("tp.embedding.bwd");
                            const Tensor all = tp.size() == 1 ? dy.contiguous() : all_gathered(dy, tp);  // [N, D]
                            Tensor mine = Tensor::empty({int64_t(own.size()), all.size(1)}, all.dtype());
                            for (size_t k = 0; k < own.size(); ++k)
                              std::memcpy(static_cast<char*>(mine.data_ptr()) + k * row_bytes,
                                          static_cast<const char*>(all.data_ptr()) + size_t(own[k]) * row_bytes, row_bytes);
                            Tensor dt = g.grad(0);
                            kernels::embedding_backward(dt, mine, local_ids);
                          });
}

Variable cross_entropy_vocab_parallel(const Variable& logits, const Tensor& targets, const ProcessGroup& tp) {
  ProfileScope prof("tp.cross_entropy.fwd");
  const Tensor lv = logits.value();
  TITAN_CHECK(lv.dim() == 2 && lv.is_contiguous() && (lv.dtype() == DType::f32 || lv.dtype() == DType::bf16),
              "cross_entropy_vocab_parallel: logits must be contiguous f32 or bf16 [N, V/tp], got " + lv.str());
  TITAN_CHECK(targets.dtype() == DType::i32 && targets.numel() == lv.size(0),
              "cross_entropy_vocab_parallel: targets must be i32 [" + std::to_string(lv.size(0)) + "], got " + targets.str());
  const int64_t n = lv.size(0), cols = lv.size(1), first = cols * tp.rank(), vocab = cols * tp.size();
  const DType dt = lv.dtype();
  const void* x = lv.data_ptr();
  const int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    TITAN_CHECK(t[i] == kernels::kIgnoreIndex || (t[i] >= 0 && t[i] < vocab),
                "cross_entropy_vocab_parallel: target " + std::to_string(t[i]) + " of token " + std::to_string(i) +
                    " is outside the vocabulary of " + std::to_string(vocab));
  // Scalar math: per row, m = max over all slices; s = sum exp(x - m) over all slices; the
  // target's logit from the slice that holds it; lse = m + log s, loss = lse - x[target].
  Tensor row_max = Tensor::empty({n}, DType::f32), sums = Tensor::empty({2, n}, DType::f32);
  float* m = row_max.data<float>();
  parallel_for(0, n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < cols; ++c) best = std::max(best, load(x, dt, i * cols + c));
      m[i] = best;
    }
  });
  tp.all_reduce(row_max, ReduceOp::max).wait();
  float* s = sums.data<float>();
  float* target_logit = s + n;
  parallel_for(0, n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      double acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += std::exp(double(load(x, dt, i * cols + c)) - double(m[i]));
      s[i] = float(acc);
      const int64_t c = int64_t(t[i]) - first;
      target_logit[i] = c >= 0 && c < cols ? load(x, dt, i * cols + c) : 0.0f;
    }
  });
  tp.all_reduce(sums, ReduceOp::sum).wait();
  Tensor lse = Tensor::empty({n}, DType::f32, MemCategory::activations);
  double total = 0;
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) {  // in token order: deterministic
    lse.data<float>()[i] = m[i] + std::log(s[i]);
    if (t[i] == kernels::kIgnoreIndex) continue;
    total += double(lse.data<float>()[i]) - double(target_logit[i]);
    ++valid;
  }
  const double mean = valid ? total / double(valid) : 0.0;
  return autograd::record(
      "tp.cross_entropy", {logits}, Tensor::full({1}, mean, DType::f32),
      [lv, targets, lse, first, valid](const Tensor& dmean, GradSink& g) {
        ProfileScope prof_bwd("tp.cross_entropy.bwd");
        const double scale = valid ? dmean.item() / double(valid) : 0.0;
        // The logits are not needed after: their buffer becomes their gradient when it can.
        const bool in_place = g.can_adopt(0);
        Tensor dl = in_place ? lv : Tensor::empty(lv.shape(), lv.dtype());
        const int64_t rows = lv.size(0), width = lv.size(1);
        const DType d = lv.dtype();
        const int32_t* tg = targets.data<int32_t>();
        const float* l = lse.data<float>();
        // Scalar math: dlogits[i, c] = (exp(x - lse) - [c == target]) * scale; ignored rows 0.
        parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) {
            const bool ignored = tg[i] == kernels::kIgnoreIndex;
            for (int64_t c = 0; c < width; ++c) {
              const float v = ignored ? 0.0f : float(std::exp(double(load(lv.data_ptr(), d, i * width + c)) - double(l[i])) * scale);
              store(dl.data_ptr(), d, i * width + c, v);
            }
            const int64_t c = int64_t(tg[i]) - first;
            if (!ignored && c >= 0 && c < width)
              store(dl.data_ptr(), d, i * width + c, load(dl.data_ptr(), d, i * width + c) - float(scale));
          }
        });
        if (in_place) {
          g.adopt(0, dl);
        } else {
          Tensor dx = g.grad(0);
          kernels::axpby(dx, dl, 1.0, 1.0);
        }
      });
}

void sum_partial_gradients(const std::vector<nn::TrainableParam>& params, const ProcessGroup& tp) {
  if (tp.size() == 1) return;
  ProfileScope prof("tp.sum_partial_gradients");
  // One all-reduce of them all: norm weights are small, and one call pays the latency once.
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (const nn::TrainableParam& p : params)
    if (p.tp_partial_grad && p.var.grad().defined()) grads.push_back(p.var.grad()), total += p.var.grad().numel();
  if (grads.empty()) return;
  Tensor flat = Tensor::empty({total}, DType::f32);
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.slice(0, at, at + g.numel()).copy_(g.contiguous().view({g.numel()}));
    at += g.numel();
  }
  tp.all_reduce(flat).wait();
  at = 0;
  for (Tensor g : grads) {
    g.copy_(flat.slice(0, at, at + g.numel()).view(g.shape()));
    at += g.numel();
  }
}

}  // namespace titan::distributed
