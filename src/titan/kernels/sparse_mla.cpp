#include "titan/kernels/sparse_mla.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/sparse_mla.h"
#include "titan/kernels/dsa_dims.h"
#include "titan/kernels/matmul_params.h"
#include "titan/kernels/onednn/matmul.h"
#include "titan/kernels/ref/sparse_mla.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

constexpr const char* kLayouts =
    "q is [B, S, H, Dqk], kv [B, Skv, Dqk], idx [B, S, K] i32, o and dout [B, S, H, Dv], lse [B, S, H] f32, dq like "
    "q, dkv like kv";

void check_tensor(const Tensor& t, const char* name, DType dtype, const Shape& shape) {
  TITAN_CHECK(t.defined(), std::string("sparse_mla: ") + name + " is undefined",
              "allocate it, e.g. Tensor::empty(" + shape.str() + ", ...)");
  TITAN_CHECK(t.shape() == shape,
              std::string("sparse_mla: ") + name + " has shape " + t.shape().str() + ", expected " + shape.str(),
              kLayouts);
  TITAN_CHECK(t.dtype() == dtype,
              std::string("sparse_mla: ") + name + " is " + std::string(dtype_name(t.dtype())) + ", expected " +
                  std::string(dtype_name(dtype)),
              "q, kv, o and the gradients share one dtype (f32 or bf16); lse is f32 and idx i32");
  TITAN_CHECK(t.is_contiguous(), std::string("sparse_mla: ") + name + " must be contiguous",
              "call .contiguous() first");
}

// Sizes from q, kv, idx, with the checks both entry points share.
SparseMlaDims sparse_mla_dims(const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t dv, double scale) {
  TITAN_CHECK(q.defined() && kv.defined() && idx.defined(), "sparse_mla: q, kv or idx is undefined",
              "pass allocated tensors");
  TITAN_CHECK(q.dim() == 4 && kv.dim() == 3 && idx.dim() == 3,
              "sparse_mla: q, kv, idx must be 4-d, 3-d, 3-d, got " + q.shape().str() + ", " + kv.shape().str() +
                  ", " + idx.shape().str(),
              kLayouts);
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "sparse_mla: dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast q and kv to f32 or bf16");
  SparseMlaDims d;
  d.B = q.size(0), d.S = q.size(1), d.H = q.size(2), d.Dqk = q.size(3);
  d.Skv = kv.size(1), d.K = idx.size(2), d.Dv = dv, d.scale = scale;
  TITAN_CHECK(d.B > 0 && d.S > 0 && d.H > 0 && d.Dqk > 0 && d.Skv > 0 && d.K > 0,
              "sparse_mla: empty dimension in q " + q.shape().str() + ", kv " + kv.shape().str() + " or idx " +
                  idx.shape().str(),
              "every size must be at least 1");
  TITAN_CHECK(d.Skv >= d.S,
              "sparse_mla: kv has " + std::to_string(d.Skv) + " positions, fewer than the " + std::to_string(d.S) +
                  " queries",
              "the queries are the last S of the Skv key positions (training: Skv == S)");
  TITAN_CHECK(dv >= 1 && dv <= d.Dqk,
              "sparse_mla: dv " + std::to_string(dv) + " is outside [1, Dqk = " + std::to_string(d.Dqk) + "]",
              "the value is the first dv dims of each latent row (512 of 576 in DeepSeek)");
  TITAN_CHECK(std::isfinite(scale) && scale != 0, "sparse_mla: scale " + std::to_string(scale) + " is not usable",
              "pass the finite, nonzero softmax scale (MLA: d_qk^-0.5 * mscale^2)");
  check_tensor(q, "q", q.dtype(), {d.B, d.S, d.H, d.Dqk});
  check_tensor(kv, "kv", q.dtype(), {d.B, d.Skv, d.Dqk});
  check_tensor(idx, "idx", DType::i32, {d.B, d.S, d.K});
  return d;
}

// ---- fast paths: the fused per-ISA kernels (f32), or the stages around oneDNN GEMMs (bf16) --

// Bytes of scratch per chunk of query rows: batches big enough for oneDNN to spread over every
// thread (at S = 1024, H = 16, K = 256 a 2 MiB budget cost 10-75% more CPU time than 32 MiB),
// small enough that a chunk's gathered rows are still in L3 when the GEMMs read them.
constexpr int64_t kChunkBytes = int64_t(32) << 20;

// Bytes of the backward's per-thread dkv accumulators together: 16 threads at Skv = 4096 and
// Dqk = 576 need 151 MB; 128K positions would need 4.8 GB.
constexpr int64_t kAccBytes = int64_t(512) << 20;

// At least one query per thread, so the per-query dkv stage keeps every thread busy.
int64_t chunk_rows(const SparseMlaDims& d, int64_t elem, bool backward) {
  int64_t per_query = d.K * d.Dqk * elem + d.K * 4 + d.H * d.K * (4 + elem);  // rows, bias, scores, P (or dS)
  if (backward) per_query += d.H * d.K * 4;                                   // dA
  return std::clamp<int64_t>(std::max<int64_t>(kChunkBytes / per_query, num_threads()), 1, d.S);
}

// One f32 dkv accumulator per thread (rows padded to whole vectors), [parts, Skv, width], for
// one batch element at a time: zeroed here, and again by the reduce that consumes it, so rows no
// query selects stay 0. At long contexts fewer accumulators than threads keep them within
// kAccBytes, and the dkv stage then runs on that many threads.
Tensor dkv_accumulators(const SparseMlaDims& d) {
  const int64_t width = TITAN_CPU_KERNEL(sparse_mla_acc_width)(d.Dqk);
  const int64_t parts = std::clamp<int64_t>(kAccBytes / (d.Skv * width * 4), 1, num_threads());
  return Tensor::zeros({parts, d.Skv, width}, DType::f32);
}

// One batched oneDNN product C[b] = alpha op(A[b]) op(B[b]) over the chunk's rows.
struct Gemm {
  MatmulParams p;
  Gemm(int64_t batch, int64_t m, int64_t n, int64_t k) { p.batch = batch, p.m = m, p.n = n, p.k = k; }
  Gemm& a(int64_t ld, int64_t stride, bool trans = false) {
    return p.lda = ld, p.batch_stride_a = stride, p.trans_a = trans, *this;
  }
  Gemm& b(int64_t ld, int64_t stride, bool trans = false) {
    return p.ldb = ld, p.batch_stride_b = stride, p.trans_b = trans, *this;
  }
  Gemm& c(int64_t ld, int64_t stride) { return p.ldc = ld, p.batch_stride_c = stride, *this; }
  Gemm& scaled(double alpha) { return p.alpha = float(alpha), *this; }
  void run(void* c, DType c_type, const void* a, const void* b, DType ab_type) const {
    onednn::matmul(c, c_type, a, b, ab_type, nullptr, p);
  }
};

template <class T>
void staged_forward(T* o, float* lse, const T* q, const T* kv, const int32_t* idx, const SparseMlaDims& d) {
  const DType dt = dtype_of<T>::value;
  const int64_t chunk = chunk_rows(d, int64_t(sizeof(T)), false);
  Tensor rows = Tensor::empty({chunk, d.K, d.Dqk}, dt);     // gathered latent rows per query
  Tensor bias = Tensor::empty({chunk, d.K}, DType::f32);     // 0 valid, -inf invalid slot
  Tensor scores = Tensor::empty({chunk, d.H, d.K}, DType::f32);
  Tensor p = Tensor::empty({chunk, d.H, d.K}, dt);
  const auto gather = TITAN_CPU_KERNEL(sparse_mla_gather<T>);
  const auto softmax = TITAN_CPU_KERNEL(sparse_mla_softmax<T>);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t0 = 0; t0 < d.S; t0 += chunk) {
      const int64_t nq = std::min(chunk, d.S - t0), row0 = b * d.S + t0;
      gather(rows.data<T>(), bias.data<float>(), kv + b * d.Skv * d.Dqk, idx + row0 * d.K, t0, nq, d);
      // scores[q] = scale * Q[q] rows[q]^T: [H, Dqk] x [Dqk, K], the rows shared by all heads
      Gemm(nq, d.H, d.K, d.Dqk).a(d.Dqk, d.H * d.Dqk).b(d.Dqk, d.K * d.Dqk, true).c(d.K, d.H * d.K).scaled(d.scale)
          .run(scores.data<float>(), DType::f32, q + row0 * d.H * d.Dqk, rows.data<T>(), dt);
      softmax(p.data<T>(), lse + row0 * d.H, scores.data<float>(), bias.data<float>(), nq, d);
      // o[q] = P[q] rows[q][:, :Dv]: [H, K] x [K, Dv]
      Gemm(nq, d.H, d.Dv, d.K).a(d.K, d.H * d.K).b(d.Dqk, d.K * d.Dqk).c(d.Dv, d.H * d.Dv)
          .run(o + row0 * d.H * d.Dv, dt, p.data<T>(), rows.data<T>(), dt);
    }
  }
}

template <class T>
void staged_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,
                     const float* lse, const SparseMlaDims& d) {
  const DType dt = dtype_of<T>::value;
  const int64_t chunk = chunk_rows(d, int64_t(sizeof(T)), true);
  Tensor rows = Tensor::empty({chunk, d.K, d.Dqk}, dt);
  Tensor bias = Tensor::empty({chunk, d.K}, DType::f32);
  Tensor scores = Tensor::empty({chunk, d.H, d.K}, DType::f32), da = Tensor::empty({chunk, d.H, d.K}, DType::f32);
  Tensor ds = Tensor::empty({chunk, d.H, d.K}, dt);  // dS as the dq GEMM's operand
  Tensor acc = dkv_accumulators(d);
  const int64_t parts = acc.size(0);
  const auto gather = TITAN_CPU_KERNEL(sparse_mla_gather<T>);
  const auto softmax_grad = TITAN_CPU_KERNEL(sparse_mla_softmax_grad<T>);
  const auto dkv_accumulate = TITAN_CPU_KERNEL(sparse_mla_dkv_accumulate<T>);
  const auto dkv_reduce = TITAN_CPU_KERNEL(sparse_mla_dkv_reduce<T>);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t0 = 0; t0 < d.S; t0 += chunk) {
      const int64_t nq = std::min(chunk, d.S - t0), row0 = b * d.S + t0;
      const T* qc = q + row0 * d.H * d.Dqk;
      const T* doc = dout + row0 * d.H * d.Dv;
      gather(rows.data<T>(), bias.data<float>(), kv + b * d.Skv * d.Dqk, idx + row0 * d.K, t0, nq, d);
      // P is recomputed from the scores and the forward's lse, never stored between passes.
      Gemm(nq, d.H, d.K, d.Dqk).a(d.Dqk, d.H * d.Dqk).b(d.Dqk, d.K * d.Dqk, true).c(d.K, d.H * d.K).scaled(d.scale)
          .run(scores.data<float>(), DType::f32, qc, rows.data<T>(), dt);
      // dA[q] = dO[q] rows[q][:, :Dv]^T: [H, Dv] x [Dv, K]
      Gemm(nq, d.H, d.K, d.Dv).a(d.Dv, d.H * d.Dv).b(d.Dqk, d.K * d.Dqk, true).c(d.K, d.H * d.K)
          .run(da.data<float>(), DType::f32, doc, rows.data<T>(), dt);
      // scores become P and dA becomes dS, both f32 for the dkv stage; dS also in T for the GEMM.
      softmax_grad(ds.data<T>(), scores.data<float>(), da.data<float>(), bias.data<float>(), lse + row0 * d.H, doc,
                   o + row0 * d.H * d.Dv, nq, d);
      // dq[q] = scale * dS[q] rows[q]: [H, K] x [K, Dqk], written straight into dq
      Gemm(nq, d.H, d.Dqk, d.K).a(d.K, d.H * d.K).b(d.Dqk, d.K * d.Dqk).c(d.Dqk, d.H * d.Dqk).scaled(d.scale)
          .run(dq + row0 * d.H * d.Dqk, dt, ds.data<T>(), rows.data<T>(), dt);
      // dkv[idx[q, i]] += scale * dS[q][:, i]^T Q[q] + P[q][:, i]^T dO[q]: the selected rows'
      // key and value roles, added in place (a [K, Dqk] product per query would be all memory
      // traffic at inner dimension H).
      dkv_accumulate(acc.data<float>(), parts, scores.data<float>(), da.data<float>(), qc, doc, bias.data<float>(),
                     idx + row0 * d.K, nq, d);
    }
    dkv_reduce(dkv + b * d.Skv * d.Dqk, acc.data<float>(), parts, d);
  }
}

// The fast path per precision, as measured (CPU time at S = 1024, H = 16, K = 256 on the 2-core
// development VM): f32 runs the fused per-query kernels (fwd 96-158 ms, bwd 233-395 ms against
// 180 and 334 ms staged), bf16 the staged path with AMX GEMMs (fwd 77-118 ms, bwd 188-286 ms
// against 88-124 and 222-270 ms fused, which multiply in f32).
template <class T>
void fast_forward(T* o, float* lse, const T* q, const T* kv, const int32_t* idx, const SparseMlaDims& d) {
  if constexpr (std::is_same_v<T, float>) {
    TITAN_CPU_KERNEL(sparse_mla_forward<T>)(o, lse, q, kv, idx, d);
  } else {
    staged_forward<T>(o, lse, q, kv, idx, d);
  }
}

template <class T>
void fast_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,
                   const float* lse, const SparseMlaDims& d) {
  if constexpr (std::is_same_v<T, float>) {
    Tensor acc = dkv_accumulators(d);
    TITAN_CPU_KERNEL(sparse_mla_backward<T>)(dq, dkv, dout, q, kv, idx, o, lse, acc.data<float>(), acc.size(0), d);
  } else {
    staged_backward<T>(dq, dkv, dout, q, kv, idx, o, lse, d);
  }
}

}  // namespace

void sparse_mla_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t dv,
                        double scale) {
  const SparseMlaDims d = sparse_mla_dims(q, kv, idx, dv, scale);
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.S, d.H});
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? &fast_forward<T> : &ref::sparse_mla_forward<T>)(o.data<T>(), lse.data<float>(), q.data<T>(),
                                                                         kv.data<T>(), idx.data<int32_t>(), d);
  });
}

void sparse_mla_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                         const Tensor& idx, const Tensor& o, const Tensor& lse, double scale) {
  TITAN_CHECK(o.defined() && o.dim() == 4, "sparse_mla_backward: o must be the forward's [B, S, H, Dv] output",
              kLayouts);
  const SparseMlaDims d = sparse_mla_dims(q, kv, idx, o.size(3), scale);
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(dout, "dout", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.S, d.H});
  check_tensor(dq, "dq", q.dtype(), q.shape());
  check_tensor(dkv, "dkv", q.dtype(), kv.shape());
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? &fast_backward<T> : &ref::sparse_mla_backward<T>)(
        dq.data<T>(), dkv.data<T>(), dout.data<T>(), q.data<T>(), kv.data<T>(), idx.data<int32_t>(), o.data<T>(),
        lse.data<float>(), d);
  });
}

}  // namespace titan::kernels
