#include "titan/kernels/grouped_matmul.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "titan/core/parallel.h"

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

// How segment [begin, end) is cut: full blocks up to blocks_end, an aligned piece (a multiple of
// kGroupedRowAlign rows, maybe empty) up to aligned_end, and a tail of fewer than
// kGroupedRowAlign rows up to end.
struct SegmentCut {
  int64_t blocks_end, aligned_end, end;
};
SegmentCut cut_segment(int64_t begin, int64_t end) {
  const int64_t blocks_end = begin + (end - begin) / kGroupedRowBlock * kGroupedRowBlock;
  return {blocks_end, blocks_end + (end - blocks_end) / kGroupedRowAlign * kGroupedRowAlign, end};
}

int64_t round_up_rows(int64_t rows) { return (rows + kGroupedRowAlign - 1) / kGroupedRowAlign * kGroupedRowAlign; }

const char* bytes(const Tensor& t) { return static_cast<const char*>(t.data_ptr()); }
char* mutable_bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// dst [kGroupedRowAlign, cols] = src rows [rows, cols], then zero rows: a padded tail whose extra
// rows add nothing to a sum over rows (and keep the discarded output rows finite).
void copy_padded_rows(char* dst, const char* src, int64_t rows, int64_t cols, int64_t elem_bytes) {
  const size_t used = size_t(rows * cols * elem_bytes);
  std::memcpy(dst, src, used);
  std::memset(dst + used, 0, size_t((kGroupedRowAlign - rows) * cols * elem_bytes));
}

// dst [rows, cols] (T) += src [rows, cols] (f32), rounded to T once; = src with accumulate false
template <class T>
void add_rows(T* dst, const float* src, int64_t rows, int64_t cols, bool accumulate) {
  // Scalar math: dst = dst + src, or dst = src without accumulate
  for (int64_t i = 0; i < rows * cols; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      dst[i] = accumulate ? dst[i] + src[i] : src[i];
    } else {
      dst[i] = f32_to_bf16(accumulate ? bf16_to_f32(dst[i]) + src[i] : src[i]);
    }
  }
}

// Scratch for padded tails, one per thread of an expert-parallel run (created on first use).
struct TailScratch {
  Tensor a, c, f32;  // [kGroupedRowAlign, K] and [kGroupedRowAlign, N] (a's dtype), f32 rows
};

// Runs f(e, this_thread_only, scratch) for every expert e. When several threads are available and
// the experts' rows can be dealt out evenly (largest-first onto the least loaded thread, within
// kBalanceSlack of a perfect split), each thread runs its own experts with one-thread products:
// segments of a few hundred rows are too small for oneDNN to split well over threads. Otherwise
// the experts run in order, each product on every thread. Either way one expert's products run
// in a fixed order on one thread, so its dw sums are the same on every run.
// The owning thread of each expert, or nothing when the experts run in order (see above).
std::vector<int> plan_experts(std::span<const int64_t> offsets, int64_t experts, int threads) {
  constexpr double kBalanceSlack = 1.15;
  std::vector<int> owner;
  if (threads > 1 && !omp_in_parallel() && experts > 1) {
    std::vector<int64_t> order(size_t(experts), 0), load(size_t(threads), 0);
    auto rows = [&](int64_t e) { return offsets[size_t(e + 1)] - offsets[size_t(e)]; };
    for (int64_t e = 0; e < experts; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return rows(x) > rows(y); });
    owner.assign(size_t(experts), 0);
    for (int64_t e : order) {
      const auto least = std::min_element(load.begin(), load.end());
      owner[size_t(e)] = int(least - load.begin());
      *least += rows(e);
    }
    const double even = double(offsets[size_t(experts)]) / threads;
    if (double(*std::max_element(load.begin(), load.end())) > kBalanceSlack * even) owner.clear();
  }
  return owner;
}

template <class F>
void for_each_expert(std::span<const int64_t> offsets, int64_t experts, F&& f) {
  const int threads = num_threads();
  const std::vector<int> owner = plan_experts(offsets, experts, threads);
  if (owner.empty()) {
    TailScratch scratch;
    for (int64_t e = 0; e < experts; ++e) f(e, false, scratch);
    return;
  }
  std::exception_ptr failure;
#pragma omp parallel num_threads(threads)
  {
    TailScratch scratch;
    const int me = omp_get_thread_num();
    try {
      for (int64_t e = 0; e < experts; ++e) {
        if (owner[size_t(e)] == me) f(e, true, scratch);
      }
    } catch (...) {
#pragma omp critical(titan_grouped_matmul_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

bool grouped_matmul_runs_experts_in_parallel(std::span<const int64_t> offsets) {
  return detail::use_fast() && !offsets.empty() &&
         !plan_experts(offsets, int64_t(offsets.size()) - 1, num_threads()).empty();
}

void grouped_matmul_forward(Tensor& c, const Tensor& a, const Tensor& w, std::span<const int64_t> offsets) {
  const GroupedShape s = check_grouped("grouped_matmul_forward", a, w, c, offsets);
  if (!detail::use_fast()) {
    detail::dispatch_activation(a.dtype(), [&]<class T>() {
      ref::grouped_matmul_forward<T>(c.data<T>(), a.data<T>(), w.data<T>(), offsets.data(), s.experts, s.n, s.k);
    });
    return;
  }
  const int64_t es = int64_t(dtype_bits(a.dtype()) / 8);
  for_each_expert(offsets, s.experts, [&](int64_t e, bool this_thread_only, TailScratch& scratch) {
    // c[row : row + rows] [rows, N] = a[row : row + rows] [rows, K] @ w[e] [N, K]^T
    auto product = [&](char* c_rows, const char* a_rows, int64_t rows) {
      MatmulParams p = linear_forward_params(rows, s.k, s.n);
      p.this_thread_only = this_thread_only;
      matmul(c_rows, c.dtype(), a_rows, bytes(w) + e * s.n * s.k * es, a.dtype(), nullptr, p);
    };
    const int64_t begin = offsets[size_t(e)];
    const SegmentCut cut = cut_segment(begin, offsets[size_t(e + 1)]);
    for (int64_t row = begin; row < cut.blocks_end; row += kGroupedRowBlock) {
      product(mutable_bytes(c) + row * s.n * es, bytes(a) + row * s.k * es, kGroupedRowBlock);
    }
    const int64_t rest = cut.end - cut.blocks_end, padded = round_up_rows(rest);
    if (rest == 0) return;
    // Rows past the segment belong to later experts, which run after this one (on this thread)
    // and overwrite them: computing them costs at most kGroupedRowAlign - 1 rows and saves a
    // second product. Not when experts run side by side: those rows may be another thread's.
    if (!this_thread_only && cut.blocks_end + padded <= s.m) {
      product(mutable_bytes(c) + cut.blocks_end * s.n * es, bytes(a) + cut.blocks_end * s.k * es, padded);
      return;
    }
    if (cut.aligned_end > cut.blocks_end) {
      product(mutable_bytes(c) + cut.blocks_end * s.n * es, bytes(a) + cut.blocks_end * s.k * es,
              cut.aligned_end - cut.blocks_end);
    }
    const int64_t tail = cut.end - cut.aligned_end;
    if (tail == 0) return;
    if (!scratch.a.defined()) {
      scratch.a = Tensor::empty({kGroupedRowAlign, s.k}, a.dtype());
      scratch.c = Tensor::empty({kGroupedRowAlign, s.n}, c.dtype());
    }
    copy_padded_rows(mutable_bytes(scratch.a), bytes(a) + cut.aligned_end * s.k * es, tail, s.k, es);
    product(mutable_bytes(scratch.c), bytes(scratch.a), kGroupedRowAlign);
    std::memcpy(mutable_bytes(c) + cut.aligned_end * s.n * es, bytes(scratch.c), size_t(tail * s.n * es));
  });
}

void grouped_matmul_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const Tensor& a, const Tensor& w,
                             std::span<const int64_t> offsets, bool accumulate_dw, bool accumulate_da) {
  const GroupedShape s = check_grouped("grouped_matmul_backward", a, w, dc, offsets);
  if (da.defined()) {
    TITAN_CHECK(da.shape() == a.shape() && da.dtype() == a.dtype() && da.is_contiguous(),
                "grouped_matmul_backward: da " + da.str() + " must match a " + a.str(), "allocate da like a");
  }
  if (dw.defined()) detail::check_f32(dw, s.experts * s.n * s.k, "grouped_matmul_backward", "dw");
  if (!detail::use_fast()) {
    if (dw.defined() && !accumulate_dw) Tensor(dw).zero_();  // handle copies: the same storage
    if (da.defined() && !accumulate_da) Tensor(da).zero_();
    detail::dispatch_activation(a.dtype(), [&]<class T>() {
      ref::grouped_matmul_backward<T>(da.defined() ? da.data<T>() : nullptr, dw.defined() ? dw.data<float>() : nullptr,
                                      dc.data<T>(), a.data<T>(), w.data<T>(), offsets.data(), s.experts, s.n, s.k);
    });
    return;
  }
  const int64_t es = int64_t(dtype_bits(a.dtype()) / 8);
  for_each_expert(offsets, s.experts, [&](int64_t e, bool this_thread_only, TailScratch& scratch) {
    const char* we = bytes(w) + e * s.n * s.k * es;
    float* dwe = dw.defined() ? dw.data<float>() + e * s.n * s.k : nullptr;
    auto run = [&](void* out, DType out_type, const void* lhs, const void* rhs, MatmulParams p) {
      p.this_thread_only = this_thread_only;
      matmul(out, out_type, lhs, rhs, a.dtype(), nullptr, p);
    };
    // Without accumulate_dw the expert's first dw product writes (beta = 0) and the rest add; an
    // expert with no rows gets zeros.
    bool dw_written = accumulate_dw;
    auto dw_params = [&](int64_t rows) {
      MatmulParams p = linear_dw_params(rows, s.k, s.n);
      if (!dw_written) p.beta = 0, dw_written = true;
      return p;
    };
    // da[rows, K] += dc[rows, N] @ w[e] [N, K];  dw[e] [N, K] += dc^T [N, rows] @ a [rows, K], in
    // f32 whatever the inputs (the sum over rows is the K of this product)
    auto products = [&](int64_t row, int64_t rows) {
      const char* dce = bytes(dc) + row * s.n * es;
      if (da.defined()) {
        MatmulParams p = linear_dx_params(rows, s.k, s.n);
        if (!accumulate_da) p.beta = 0;
        run(mutable_bytes(da) + row * s.k * es, da.dtype(), dce, we, p);
      }
      if (dw.defined()) run(dwe, DType::f32, dce, bytes(a) + row * s.k * es, dw_params(rows));
    };
    const int64_t begin = offsets[size_t(e)];
    const SegmentCut cut = cut_segment(begin, offsets[size_t(e + 1)]);
    for (int64_t row = begin; row < cut.blocks_end; row += kGroupedRowBlock) products(row, kGroupedRowBlock);
    if (cut.aligned_end > cut.blocks_end) products(cut.blocks_end, cut.aligned_end - cut.blocks_end);
    const int64_t tail = cut.end - cut.aligned_end;
    if (tail == 0) {
      if (dwe && !dw_written) std::memset(dwe, 0, size_t(s.n * s.k) * sizeof(float));
      return;
    }
    // A tail of fewer than kGroupedRowAlign rows runs padded with zero rows: they add nothing to
    // dw, and their rows of da land in an f32 scratch, of which only the tail's rows are added.
    if (!scratch.c.defined()) {
      scratch.c = Tensor::empty({kGroupedRowAlign, s.n}, a.dtype());  // dc's tail
      scratch.a = Tensor::empty({kGroupedRowAlign, s.k}, a.dtype());
      scratch.f32 = Tensor::empty({kGroupedRowAlign, s.k}, DType::f32);  // da's tail
    }
    copy_padded_rows(mutable_bytes(scratch.c), bytes(dc) + cut.aligned_end * s.n * es, tail, s.n, es);
    if (da.defined()) {
      MatmulParams p = linear_dx_params(kGroupedRowAlign, s.k, s.n);
      p.beta = 0;
      run(scratch.f32.data<float>(), DType::f32, bytes(scratch.c), we, p);
      detail::dispatch_activation(a.dtype(), [&]<class T>() {
        add_rows(da.data<T>() + cut.aligned_end * s.k, scratch.f32.data<float>(), tail, s.k, accumulate_da);
      });
    }
    if (dw.defined()) {
      copy_padded_rows(mutable_bytes(scratch.a), bytes(a) + cut.aligned_end * s.k * es, tail, s.k, es);
      run(dwe, DType::f32, bytes(scratch.c), bytes(scratch.a), dw_params(kGroupedRowAlign));
    }
  });
}

}  // namespace titan::kernels
