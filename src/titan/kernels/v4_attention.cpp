#include "titan/kernels/v4_attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/v4_attention.h"
#include "titan/kernels/ref/v4_attention.h"
#include "titan/kernels/tensor_checks.h"
#include "titan/kernels/v4_attention_params.h"

namespace titan::kernels {

namespace {

constexpr const char* kLayouts =
    "q, o, dout, dq are [B, S, H, D], kv and dkv [B, Skv, D] (Skv >= S), comp and dcomp [B, T, D] (T may be 0), "
    "idx [B, S, K] i32 "
    "or undefined (HCA), sink and dsink [H] f32 or undefined, lse [B, S, H] f32";

void check_tensor(const Tensor& t, const char* name, DType dtype, const Shape& shape) {
  TITAN_CHECK(t.defined(), std::string("v4_attention: ") + name + " is undefined",
              "allocate it, e.g. Tensor::empty(" + shape.str() + ", ...)");
  TITAN_CHECK(t.shape() == shape,
              std::string("v4_attention: ") + name + " has shape " + t.shape().str() + ", expected " + shape.str(),
              kLayouts);
  TITAN_CHECK(t.dtype() == dtype,
              std::string("v4_attention: ") + name + " is " + std::string(dtype_name(t.dtype())) + ", expected " +
                  std::string(dtype_name(dtype)),
              "q, kv, comp, o and their gradients share one dtype (f32 or bf16); lse, sink and dsink are f32, idx i32");
  TITAN_CHECK(t.is_contiguous(), std::string("v4_attention: ") + name + " must be contiguous", "call .contiguous() first");
}

// Sizes from q, kv, comp, idx, with the checks both entry points share.
V4AttentionParams v4_dims(const Tensor& q, const Tensor& kv, const Tensor& comp, const Tensor& idx, const Tensor& sink,
                          int64_t window, int64_t ratio, double scale, int64_t pos0) {
  TITAN_CHECK(q.defined() && kv.defined() && comp.defined(), "v4_attention: q, kv or comp is undefined",
              "pass allocated tensors (comp [B, 0, D] on a sliding-only layer)");
  TITAN_CHECK(q.dim() == 4 && kv.dim() == 3 && comp.dim() == 3,
              "v4_attention: q, kv, comp must be 4-d, 3-d, 3-d, got " + q.shape().str() + ", " + kv.shape().str() +
                  ", " + comp.shape().str(),
              kLayouts);
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "v4_attention: dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast q, kv and comp to f32 or bf16");
  V4AttentionParams d;
  d.B = q.size(0), d.S = q.size(1), d.H = q.size(2), d.D = q.size(3);
  d.Skv = kv.size(1), d.P0 = pos0;
  d.T = comp.size(1), d.W = window, d.ratio = ratio, d.scale = scale;
  d.K = idx.defined() ? (idx.dim() == 3 ? idx.size(2) : -1) : 0;
  TITAN_CHECK(d.B > 0 && d.S > 0 && d.H > 0 && d.D > 0,
              "v4_attention: empty dimension in q " + q.shape().str(), "B, S, H and D must be at least 1");
  TITAN_CHECK(window >= 1, "v4_attention: window " + std::to_string(window) + " is below 1",
              "the sliding window counts the query itself (V4: sliding_window = 128)");
  TITAN_CHECK(ratio >= 2, "v4_attention: compress ratio " + std::to_string(ratio) + " is below 2",
              "pass the layer's compress rate (CSA 4, HCA 128; any value >= 2 on a sliding-only layer with T = 0)");
  TITAN_CHECK(d.Skv >= d.S && pos0 >= d.Skv - d.S,
              "v4_attention: " + std::to_string(d.Skv) + " key rows for " + std::to_string(d.S) +
                  " queries whose first sits at position " + std::to_string(pos0),
              "the queries are the last S of the Skv key rows (Skv >= S), and the rows before them are earlier "
              "positions (first query position >= Skv - S)");
  TITAN_CHECK(d.T <= (pos0 + d.S) / ratio,
              "v4_attention: " + std::to_string(d.T) + " compressed entries, more than floor((P0 + S) / m) = " +
                  std::to_string((pos0 + d.S) / ratio) + " (P0 = " + std::to_string(pos0) + ", S = " +
                  std::to_string(d.S) + ", m = " + std::to_string(ratio) + ")",
              "comp holds the compressor's complete windows up to the last query only: T = floor((P0 + S) / m)");
  TITAN_CHECK(std::isfinite(scale) && scale != 0, "v4_attention: scale " + std::to_string(scale) + " is not usable",
              "pass the finite, nonzero softmax scale (V4: head_dim^-0.5)");
  check_tensor(q, "q", q.dtype(), {d.B, d.S, d.H, d.D});
  check_tensor(kv, "kv", q.dtype(), {d.B, d.Skv, d.D});
  check_tensor(comp, "comp", q.dtype(), {d.B, d.T, d.D});
  if (idx.defined()) {
    TITAN_CHECK(d.K >= 1, "v4_attention: idx " + idx.shape().str() + " has no slots",
                "pass the CSA top-k [B, S, K] with K >= 1, or an undefined idx for HCA");
    check_tensor(idx, "idx", DType::i32, {d.B, d.S, d.K});
  }
  if (sink.defined()) check_tensor(sink, "sink", DType::f32, {d.H});
  return d;
}

// ---- fast path: the fused per-ISA kernels of cpu/v4_attention.h ----------------------------------

// Bytes of the backward's per-thread key-gradient accumulators together (16 threads at S = 32K,
// D = 512 would need 1.1 GB); past it fewer threads run the backward.
constexpr int64_t kAccBytes = int64_t(512) << 20;

template <class T>
void fast_backward(T* dq, T* dkv, T* dcomp, float* dsink, const T* dout, const T* q, const T* kv, const T* comp,
                   const int32_t* idx, const float* sink, const T* o, const float* lse, const V4AttentionParams& d) {
  const int64_t width = TITAN_CPU_KERNEL(v4_attention_acc_width)(d.D), rows = d.Skv + d.T;
  const int64_t parts = std::clamp<int64_t>(kAccBytes / (rows * width * 4), 1, num_threads());
  Tensor acc = Tensor::zeros({parts, rows, width}, DType::f32);
  TITAN_CPU_KERNEL(v4_attention_backward<T>)(dq, dkv, dcomp, dsink, dout, q, kv, comp, idx, sink, o, lse,
                                             acc.data<float>(), parts, d);
}

}  // namespace

void v4_attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& comp,
                          const Tensor& idx, const Tensor& sink, int64_t window, int64_t ratio, double scale,
                          Tensor* head_mean, int64_t pos0) {
  const V4AttentionParams d = v4_dims(q, kv, comp, idx, sink, window, ratio, scale, pos0);
  check_tensor(o, "o", q.dtype(), q.shape());
  check_tensor(lse, "lse", DType::f32, {d.B, d.S, d.H});
  if (head_mean) {
    TITAN_CHECK(idx.defined(), "v4_attention: head_mean asked of an HCA call (no idx)",
                "the indexer's target exists on CSA layers only: pass idx, or no head_mean");
    check_tensor(*head_mean, "head_mean", DType::f32, {d.B, d.S, d.K});
  }
  const int32_t* ip = idx.defined() ? idx.data<int32_t>() : nullptr;
  const float* sp = sink.defined() ? sink.data<float>() : nullptr;
  float* hm = head_mean ? head_mean->data<float>() : nullptr;
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(v4_attention_forward<T>) : &ref::v4_attention_forward<T>)(
        o.data<T>(), lse.data<float>(), hm, q.data<T>(), kv.data<T>(), comp.data<T>(), ip, sp, d);
  });
}

void v4_attention_backward(Tensor& dq, Tensor& dkv, Tensor& dcomp, Tensor& dsink, const Tensor& dout, const Tensor& q,
                           const Tensor& kv, const Tensor& comp, const Tensor& idx, const Tensor& sink, const Tensor& o,
                           const Tensor& lse, int64_t window, int64_t ratio, double scale, int64_t pos0) {
  const V4AttentionParams d = v4_dims(q, kv, comp, idx, sink, window, ratio, scale, pos0);
  check_tensor(o, "o", q.dtype(), q.shape());
  check_tensor(dout, "dout", q.dtype(), q.shape());
  check_tensor(lse, "lse", DType::f32, {d.B, d.S, d.H});
  check_tensor(dq, "dq", q.dtype(), q.shape());
  check_tensor(dkv, "dkv", q.dtype(), kv.shape());
  check_tensor(dcomp, "dcomp", q.dtype(), comp.shape());
  if (sink.defined()) check_tensor(dsink, "dsink", DType::f32, {d.H});
  const int32_t* ip = idx.defined() ? idx.data<int32_t>() : nullptr;
  const float* sp = sink.defined() ? sink.data<float>() : nullptr;
  float* dsp = sink.defined() ? dsink.data<float>() : nullptr;
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? &fast_backward<T> : &ref::v4_attention_backward<T>)(
        dq.data<T>(), dkv.data<T>(), dcomp.data<T>(), dsp, dout.data<T>(), q.data<T>(), kv.data<T>(), comp.data<T>(),
        ip, sp, o.data<T>(), lse.data<float>(), d);
  });
}

}  // namespace titan::kernels
