#include "titan/kernels/sparse_mla.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/sparse_mla.h"
#include "titan/kernels/dsa_params.h"
#include "titan/kernels/ref/sparse_mla.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

constexpr const char* kLayouts =
    "q is [B, S, H, Dqk], kv [B, Skv, Dqk], idx [B, S, K] i32, o and dout [B, S, H, Dv], lse [B, S, H] f32, head_mean "
    "[B, S, K] f32, dq like q, dkv like kv";

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
SparseMlaParams sparse_mla_dims(const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t dv, double scale) {
  TITAN_CHECK(q.defined() && kv.defined() && idx.defined(), "sparse_mla: q, kv or idx is undefined",
              "pass allocated tensors");
  TITAN_CHECK(q.dim() == 4 && kv.dim() == 3 && idx.dim() == 3,
              "sparse_mla: q, kv, idx must be 4-d, 3-d, 3-d, got " + q.shape().str() + ", " + kv.shape().str() +
                  ", " + idx.shape().str(),
              kLayouts);
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "sparse_mla: dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast q and kv to f32 or bf16");
  SparseMlaParams d;
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

// ---- fast path: the fused per-ISA kernels of cpu/sparse_mla.h ------------------------------------
//
// They multiply in f32 for bf16 inputs too. A staged bf16 variant (gather a chunk of queries'
// rows, oneDNN batched AMX GEMMs, separate softmax passes) measured the same at S = 1024, H = 16,
// K = 256 and 2x slower at K = 2048 with causal padding slots, whose zero rows it must multiply.

// Bytes of the backward's per-thread dkv accumulators together: 16 threads at Skv = 4096 and
// Dqk = 576 need 151 MB; 128K positions would need 4.8 GB.
constexpr int64_t kAccBytes = int64_t(512) << 20;

// One f32 dkv accumulator per thread (rows padded to whole vectors), [parts, Skv, width], zeroed
// here and left zeroed by the kernel. At long contexts fewer accumulators than threads keep them
// within kAccBytes, and the backward then runs on that many threads.
Tensor dkv_accumulators(const SparseMlaParams& d) {
  const int64_t width = TITAN_CPU_KERNEL(sparse_mla_acc_width)(d.Dqk);
  const int64_t parts = std::clamp<int64_t>(kAccBytes / (d.Skv * width * 4), 1, num_threads());
  return Tensor::zeros({parts, d.Skv, width}, DType::f32);
}

template <class T>
void fast_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,
                   const float* lse, const SparseMlaParams& d) {
  Tensor acc = dkv_accumulators(d);
  TITAN_CPU_KERNEL(sparse_mla_backward<T>)(dq, dkv, dout, q, kv, idx, o, lse, acc.data<float>(), acc.size(0), d);
}

}  // namespace

void sparse_mla_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t dv,
                        double scale, Tensor* head_mean) {
  const SparseMlaParams d = sparse_mla_dims(q, kv, idx, dv, scale);
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.S, d.H});
  if (head_mean) check_tensor(*head_mean, "head_mean", DType::f32, {d.B, d.S, d.K});
  float* hm = head_mean ? head_mean->data<float>() : nullptr;
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(sparse_mla_forward<T>) : &ref::sparse_mla_forward<T>)(
        o.data<T>(), lse.data<float>(), hm, q.data<T>(), kv.data<T>(), idx.data<int32_t>(), d);
  });
}

void sparse_mla_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                         const Tensor& idx, const Tensor& o, const Tensor& lse, double scale) {
  TITAN_CHECK(o.defined() && o.dim() == 4, "sparse_mla_backward: o must be the forward's [B, S, H, Dv] output",
              kLayouts);
  const SparseMlaParams d = sparse_mla_dims(q, kv, idx, o.size(3), scale);
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
