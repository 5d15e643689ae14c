#include "titan/kernels/moe_permute.h"

#include <string>

#include "titan/kernels/cpu/moe_permute.h"
#include "titan/kernels/gather.h"
#include "titan/kernels/ref/moe_permute.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {
namespace {

struct PermuteShape {
  int64_t n, k, d;
};

// Validates tokens [N, D], the sorted buffer [N k, D] and pos [N, k].
PermuteShape check_permute(const char* op, const Tensor& tokens, const Tensor& sorted, const Tensor& pos) {
  detail::check_activation(tokens, op, "token rows");
  detail::check_activation(sorted, op, "sorted rows");
  TITAN_CHECK(pos.defined() && pos.dim() == 2 && pos.dtype() == DType::i32 && pos.is_contiguous() &&
                  tokens.dim() == 2 && pos.size(0) == tokens.size(0),
              std::string(op) + ": pos must be contiguous i32 [N, k] for tokens " + tokens.str() + ", got " +
                  (pos.defined() ? pos.str() : std::string("undefined")),
              "use the pos of moe_sort_by_expert on this batch's expert choices");
  const PermuteShape s{tokens.size(0), pos.size(1), tokens.size(1)};
  TITAN_CHECK(sorted.dim() == 2 && sorted.size(0) == s.n * s.k && sorted.size(1) == s.d &&
                  sorted.dtype() == tokens.dtype(),
              std::string(op) + ": sorted buffer " + sorted.str() + " for " + std::to_string(s.n) + " tokens x " +
                  std::to_string(s.k) + " choices of rows " + tokens.str(),
              "the sorted buffer has N k rows of the tokens' width and dtype");
  check_row_indices(pos, s.n * s.k, op, "sorted position", "pos must come from moe_sort_by_expert", "the sorted buffer");
  return s;
}

void check_weights(const char* op, const Tensor& w, const PermuteShape& s, const char* name) {
  detail::check_f32(w, s.n * s.k, op, name);
}

}  // namespace

ExpertDispatch moe_sort_by_expert(const Tensor& indices, int64_t experts) {
  TITAN_CHECK(indices.dim() == 2 && experts >= 1, "moe_sort_by_expert: indices " + indices.str(),
              "pass the router's [N, k] expert choices and the number of experts");
  check_row_indices(indices, experts, "moe_sort_by_expert", "expert", "expert choices must be in [0, E)", "the experts");
  const int64_t n = indices.size(0), k = indices.size(1), m = n * k;
  const int32_t* idx = indices.data<int32_t>();
  ExpertDispatch r;
  r.offsets.assign(size_t(experts + 1), 0);
  for (int64_t i = 0; i < m; ++i) ++r.offsets[size_t(idx[i]) + 1];
  for (int64_t e = 0; e < experts; ++e) r.offsets[size_t(e + 1)] += r.offsets[size_t(e)];
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.pos = Tensor::empty({n, k}, DType::i32, MemCategory::activations);
  int32_t* pos = r.pos.data<int32_t>();
  for (int64_t i = 0; i < m; ++i) pos[i] = int32_t(next[size_t(idx[i])]++);
  return r;
}

void moe_permute_forward(Tensor& xs, const Tensor& x, const Tensor& pos) {
  const PermuteShape s = check_permute("moe_permute_forward", x, xs, pos);
  detail::dispatch_activation(x.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(moe_permute_forward<T>) : &ref::moe_permute_forward<T>)(
        xs.data<T>(), x.data<T>(), pos.data<int32_t>(), s.n, s.k, s.d);
  });
}

void moe_permute_backward(const Tensor& dx, const Tensor& dxs, const Tensor& pos) {
  const PermuteShape s = check_permute("moe_permute_backward", dx, dxs, pos);
  detail::dispatch_activation(dx.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(moe_permute_backward<T>) : &ref::moe_permute_backward<T>)(
        dx.data<T>(), dxs.data<T>(), pos.data<int32_t>(), s.n, s.k, s.d);
  });
}

void moe_unpermute_forward(Tensor& y, const Tensor& out, const Tensor& pos, const Tensor& w) {
  const PermuteShape s = check_permute("moe_unpermute_forward", y, out, pos);
  check_weights("moe_unpermute_forward", w, s, "w");
  detail::dispatch_activation(y.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(moe_unpermute_forward<T>) : &ref::moe_unpermute_forward<T>)(
        y.data<T>(), out.data<T>(), pos.data<int32_t>(), w.data<float>(), s.n, s.k, s.d);
  });
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& dw, const Tensor& dy, const Tensor& out,
                            const Tensor& pos, const Tensor& w) {
  const char* op = "moe_unpermute_backward";
  const PermuteShape s = check_permute(op, dy, out, pos);
  check_weights(op, w, s, "w");
  if (dw.defined()) check_weights(op, dw, s, "dw");
  if (dout.defined()) {
    TITAN_CHECK(dout.shape() == out.shape() && dout.dtype() == out.dtype() && dout.is_contiguous(),
                std::string(op) + ": dout " + dout.str() + " must match out " + out.str(), "allocate dout like out");
  }
  // The fused kernel writes dout and accumulates dw in one pass; a caller that wants only dw
  // still gets it from the same pass over a scratch dout.
  const Tensor dout_buf = dout.defined() ? dout : Tensor::empty(out.shape(), out.dtype());
  Tensor dw_buf = dw.defined() ? dw : Tensor::zeros({s.n, s.k}, DType::f32);
  detail::dispatch_activation(dy.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(moe_unpermute_backward<T>) : &ref::moe_unpermute_backward<T>)(
        dout_buf.data<T>(), dw_buf.data<float>(), dy.data<T>(), out.data<T>(), pos.data<int32_t>(), w.data<float>(),
        s.n, s.k, s.d);
  });
}

}  // namespace titan::kernels
