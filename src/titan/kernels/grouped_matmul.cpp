#include "titan/kernels/grouped_matmul.h"

#include <string>

#include "titan/kernels/matmul.h"
#include "titan/kernels/ref/grouped_matmul.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {
namespace {

struct GroupedShape {
  int64_t m, n, k, experts;
};

GroupedShape check_grouped(const char* op, const Tensor& a, const Tensor& w, const Tensor& c_like,
                           std::span<const int64_t> offsets) {
  detail::check_activation(a, op, "a");
  TITAN_CHECK(a.dim() == 2 && w.dim() == 3 && w.size(2) == a.size(1),
              std::string(op) + ": a " + a.str() + " and w " + w.str() + " do not chain",
              "a is [M, K] tokens sorted by expert, w is [E, N, K] (one linear weight per expert)");
  TITAN_CHECK(w.dtype() == a.dtype() && w.is_contiguous(),
              std::string(op) + ": w " + w.str() + " must be contiguous with a's dtype " +
                  std::string(dtype_name(a.dtype())),
              "under mixed precision pass the weight's bf16 compute copy");
  const GroupedShape s{a.size(0), w.size(1), a.size(1), w.size(0)};
  TITAN_CHECK(c_like.defined() && c_like.dim() == 2 && c_like.size(0) == s.m && c_like.size(1) == s.n &&
                  c_like.dtype() == a.dtype() && c_like.is_contiguous(),
              std::string(op) + ": output (or its gradient) " + c_like.str() + " must be contiguous [" +
                  std::to_string(s.m) + ", " + std::to_string(s.n) + "] with a's dtype",
              "c has one row per row of a and one column per output feature of w");
  TITAN_CHECK(int64_t(offsets.size()) == s.experts + 1 && offsets[0] == 0 && offsets[size_t(s.experts)] == s.m,
              std::string(op) + ": " + std::to_string(offsets.size()) + " offsets for " + std::to_string(s.experts) +
                  " experts and " + std::to_string(s.m) + " rows",
              "offsets are the E + 1 prefix sums of tokens per expert, from 0 to M");
  for (int64_t e = 0; e < s.experts; ++e) {
    TITAN_CHECK(offsets[size_t(e)] <= offsets[size_t(e + 1)],
                std::string(op) + ": offsets decrease at expert " + std::to_string(e),
                "offsets must be non-decreasing (tokens per expert are counts)");
  }
  return s;
}

// Calls f(row, rows) for the pieces of segment [begin, end): full blocks, then the tail as
// descending powers of two, so every piece size is from a fixed set of log2(block) + 1 values.
template <class F>
void for_each_piece(int64_t begin, int64_t end, F&& f) {
  int64_t row = begin;
  while (end - row >= kGroupedRowBlock) f(row, kGroupedRowBlock), row += kGroupedRowBlock;
  for (int64_t piece = kGroupedRowBlock / 2; piece >= 1; piece /= 2) {
    if (end - row >= piece) f(row, piece), row += piece;
  }
}

const char* bytes(const Tensor& t) { return static_cast<const char*>(t.data_ptr()); }
char* mutable_bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

void grouped_matmul_forward(Tensor& c, const Tensor& a, const Tensor& w, std::span<const int64_t> offsets) {
  const GroupedShape s = check_grouped("grouped_matmul_forward", a, w, c, offsets);
  if (!detail::use_fast()) {
    detail::dispatch_activation(a.dtype(), [&]<class T>() {
      ref::grouped_matmul_forward<T>(c.data<T>(), a.data<T>(), w.data<T>(), offsets.data(), s.experts, s.n, s.k);
    });
    return;
  }
  const int64_t es = int64_t(dtype_bits(a.dtype()) / 8);
  for (int64_t e = 0; e < s.experts; ++e) {
    const char* we = bytes(w) + e * s.n * s.k * es;
    for_each_piece(offsets[size_t(e)], offsets[size_t(e + 1)], [&](int64_t row, int64_t rows) {
      // c[row : row + rows] [rows, N] = a[row : row + rows] [rows, K] @ w[e] [N, K]^T
      matmul(mutable_bytes(c) + row * s.n * es, c.dtype(), bytes(a) + row * s.k * es, we, a.dtype(), nullptr,
             linear_forward_params(rows, s.k, s.n));
    });
  }
}

void grouped_matmul_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const Tensor& a, const Tensor& w,
                             std::span<const int64_t> offsets) {
  const GroupedShape s = check_grouped("grouped_matmul_backward", a, w, dc, offsets);
  if (da.defined()) {
    TITAN_CHECK(da.shape() == a.shape() && da.dtype() == a.dtype() && da.is_contiguous(),
                "grouped_matmul_backward: da " + da.str() + " must match a " + a.str(), "allocate da like a");
  }
  if (dw.defined()) detail::check_f32(dw, s.experts * s.n * s.k, "grouped_matmul_backward", "dw");
  if (!detail::use_fast()) {
    detail::dispatch_activation(a.dtype(), [&]<class T>() {
      ref::grouped_matmul_backward<T>(da.defined() ? da.data<T>() : nullptr, dw.defined() ? dw.data<float>() : nullptr,
                                      dc.data<T>(), a.data<T>(), w.data<T>(), offsets.data(), s.experts, s.n, s.k);
    });
    return;
  }
  const int64_t es = int64_t(dtype_bits(a.dtype()) / 8);
  for (int64_t e = 0; e < s.experts; ++e) {
    const char* we = bytes(w) + e * s.n * s.k * es;
    for_each_piece(offsets[size_t(e)], offsets[size_t(e + 1)], [&](int64_t row, int64_t rows) {
      const char* dce = bytes(dc) + row * s.n * es;
      const char* ae = bytes(a) + row * s.k * es;
      // da[rows, K] += dc[rows, N] @ w[e] [N, K]
      if (da.defined()) {
        matmul(mutable_bytes(da) + row * s.k * es, da.dtype(), dce, we, a.dtype(), nullptr,
               linear_dx_params(rows, s.k, s.n));
      }
      // dw[e] [N, K] += dc^T [N, rows] @ a [rows, K], in f32 whatever the inputs
      if (dw.defined()) {
        matmul(dw.data<float>() + e * s.n * s.k, DType::f32, dce, ae, a.dtype(), nullptr,
               linear_dw_params(rows, s.k, s.n));
      }
    });
  }
}

}  // namespace titan::kernels
