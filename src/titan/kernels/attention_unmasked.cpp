#include "titan/kernels/attention_unmasked.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <type_traits>

#include "titan/core/parallel.h"
#include "titan/kernels/attention_params.h"
#include "titan/kernels/cpu/attention_rows.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/ref/attention.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

constexpr int64_t kQueryTile = 64, kKeyTile = 256;

using ref::load;
template <class T>
T store(float v) {
  return ref::store<T>(v);
}

void check_shape(const Tensor& t, const char* name, DType dtype, const Shape& shape) {
  TITAN_CHECK(t.defined() && t.is_contiguous(), std::string("attention_unmasked: ") + name + " must be a contiguous tensor",
              "allocate it contiguous, or call .contiguous() first");
  TITAN_CHECK(t.shape() == shape && t.dtype() == dtype,
              std::string("attention_unmasked: ") + name + " is " + t.str() + ", expected " + shape.str() + " " +
                  std::string(dtype_name(dtype)),
              "q [B, Sq, H, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv], o [B, Sq, H, Dv] share q's dtype; "
              "lse [B, H, Sq] is f32");
}

UnmaskedAttentionParams unmasked_dims(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  TITAN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention_unmasked: q, k, v must be 4-d, got " + q.str() + ", " + k.str() + ", " + v.str(),
              "layouts are q [B, Sq, H, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv]");
  UnmaskedAttentionParams d;
  d.B = q.size(0), d.Sq = q.size(1), d.H = q.size(2), d.Dqk = q.size(3);
  d.Skv = k.size(1), d.Hkv = k.size(2), d.Dv = v.size(3);
  d.scale = scale;
  TITAN_CHECK(d.B > 0 && d.Sq > 0 && d.Skv > 0 && d.H > 0 && d.Hkv > 0 && d.Dqk > 0 && d.Dv > 0 && d.H % d.Hkv == 0,
              "attention_unmasked: sizes of q " + q.str() + ", k " + k.str() + ", v " + v.str() + " do not fit",
              "every size must be at least 1 and the query heads a multiple of the kv heads");
  TITAN_CHECK(std::isfinite(scale), "attention_unmasked: scale is not finite", "pass a finite softmax scale");
  check_shape(q, "q", q.dtype(), {d.B, d.Sq, d.H, d.Dqk});
  check_shape(k, "k", q.dtype(), {d.B, d.Skv, d.Hkv, d.Dqk});
  check_shape(v, "v", q.dtype(), {d.B, d.Skv, d.Hkv, d.Dv});
  return d;
}

// The first exception a worker thread caught, rethrown on the calling thread after the parallel
// region (an exception must not leave an OpenMP region).
class FirstFailure {
 public:
  void record() {
#pragma omp critical(titan_attention_unmasked_failure)
    if (!first_) first_ = std::current_exception();
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::exception_ptr first_;
};

// One product of a tile: C = alpha op(A) op(B) + beta C on the calling thread (the caller runs one
// tile per thread). Strides in elements.
void tile_gemm(float* c, int64_t ldc, const void* a, int64_t lda, const void* b, int64_t ldb, DType ab, int64_t m,
               int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha, float beta) {
  MatmulParams p;
  p.m = m, p.n = n, p.k = k, p.trans_a = trans_a, p.trans_b = trans_b;
  p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.alpha = alpha, p.beta = beta;
  p.this_thread_only = true;
  matmul(c, DType::f32, a, b, ab, nullptr, p);
}

// The operand a product reads for P or dS: the f32 tile itself, or its bf16 rounding.
template <class T>
const void* operand(const float* tile, T* low, int64_t rows, int64_t cols) {
  if constexpr (std::is_same_v<T, float>) {
    return tile;
  } else {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) low[i * kKeyTile + j] = f32_to_bf16(tile[i * kKeyTile + j]);
    return low;
  }
}

template <class T>
void forward_tiles(T* o, float* lse, const T* q, const T* k, const T* v, const UnmaskedAttentionParams& d) {
  const DType ab = dtype_of<T>::value;
  const int64_t group = d.H / d.Hkv, q_tiles = (d.Sq + kQueryTile - 1) / kQueryTile, items = d.B * d.H * q_tiles;
  const int threads = int(std::min<int64_t>(num_threads(), items));
  const int64_t per_thread = kQueryTile * kKeyTile + kQueryTile * d.Dv + 3 * kQueryTile;
  Tensor scratch = Tensor::empty({threads * per_thread}, DType::f32, MemCategory::temporaries);
  // bf16 rounds P for its product; f32 reads the f32 tile.
  Tensor low = Tensor::empty({std::is_same_v<T, float> ? 0 : threads * kQueryTile * kKeyTile}, ab, MemCategory::temporaries);
  FirstFailure failure;
#pragma omp parallel num_threads(threads)
  {
    float* s = scratch.data<float>() + omp_get_thread_num() * per_thread;  // [Tq, Tk] scores, then P
    float* acc = s + kQueryTile * kKeyTile;                                 // [Tq, Dv] unnormalized o
    float* m = acc + kQueryTile * d.Dv;                                     // [Tq] running max
    float* l = m + kQueryTile;                                              // [Tq] running sum
    float* alpha = l + kQueryTile;                                          // [Tq] rescale of this tile
    T* p_low = std::is_same_v<T, float> ? nullptr : low.data<T>() + omp_get_thread_num() * kQueryTile * kKeyTile;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < items; ++t) {
      try {
        const int64_t b = t / (d.H * q_tiles), h = t / q_tiles % d.H, i0 = t % q_tiles * kQueryTile;
        const int64_t g = h / group, rows = std::min(kQueryTile, d.Sq - i0);
        const T* q_rows = q + ((b * d.Sq + i0) * d.H + h) * d.Dqk;
        std::fill(m, m + rows, -INFINITY);
        std::fill(l, l + rows, 0.0f);
        std::fill(acc, acc + rows * d.Dv, 0.0f);
        for (int64_t j0 = 0; j0 < d.Skv; j0 += kKeyTile) {
          const int64_t cols = std::min(kKeyTile, d.Skv - j0);
          tile_gemm(s, kKeyTile, q_rows, d.H * d.Dqk, k + ((b * d.Skv + j0) * d.Hkv + g) * d.Dqk, d.Hkv * d.Dqk, ab,
                    rows, cols, d.Dqk, false, true, float(d.scale), 0);
          TITAN_CPU_KERNEL(online_softmax_rows)(s, kKeyTile, rows, cols, m, l, alpha);  // FlashAttention-2 style
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < d.Dv; ++c) acc[i * d.Dv + c] *= alpha[i];
          tile_gemm(acc, d.Dv, operand(s, p_low, rows, cols), kKeyTile, v + ((b * d.Skv + j0) * d.Hkv + g) * d.Dv,
                    d.Hkv * d.Dv, ab, rows, d.Dv, cols, false, false, 1, 1);
        }
        for (int64_t i = 0; i < rows; ++i) {
          T* out = o + ((b * d.Sq + i0 + i) * d.H + h) * d.Dv;
          for (int64_t c = 0; c < d.Dv; ++c) out[c] = store<T>(acc[i * d.Dv + c] / l[i]);
          lse[(b * d.H + h) * d.Sq + i0 + i] = m[i] + std::log(l[i]);
        }
      } catch (...) {
        failure.record();
      }
    }
  }
  failure.rethrow();
}

// One work item per (batch, kv head): its dk and dv rows collect every query of the group in
// per-thread f32 buffers, so no two items write the same memory and sums run in a fixed order.
// G: the gradients' type (T, or f32 with bf16 inputs).
template <class T, class G>
void backward_tiles(G* dq, G* dk, G* dv, const float* lse, const T* dout, const T* q, const T* k, const T* v,
                    const T* o, const UnmaskedAttentionParams& d) {
  const DType ab = dtype_of<T>::value;
  const int64_t group = d.H / d.Hkv, items = d.B * d.Hkv;
  const int threads = int(std::min<int64_t>(num_threads(), items));
  const int64_t tile = kQueryTile * kKeyTile;
  const int64_t per_thread = 2 * tile + kQueryTile * d.Dqk + 2 * kQueryTile + d.Skv * (d.Dqk + d.Dv);
  Tensor scratch = Tensor::empty({threads * per_thread}, DType::f32, MemCategory::temporaries);
  Tensor low = Tensor::empty({std::is_same_v<T, float> ? 0 : threads * 2 * tile}, ab, MemCategory::temporaries);
  FirstFailure failure;
#pragma omp parallel num_threads(threads)
  {
    float* p = scratch.data<float>() + omp_get_thread_num() * per_thread;  // [Tq, Tk] P
    float* ds = p + tile;                                                  // [Tq, Tk] dP, then dS
    float* dq_acc = ds + tile;                                             // [Tq, Dqk]
    float* lse_i = dq_acc + kQueryTile * d.Dqk;                            // [Tq]
    float* delta = lse_i + kQueryTile;                                     // [Tq] D = rowsum(dO * O)
    float* dk_acc = delta + kQueryTile;                                    // [Skv, Dqk]
    float* dv_acc = dk_acc + d.Skv * d.Dqk;                                // [Skv, Dv]
    T* p_low = std::is_same_v<T, float> ? nullptr : low.data<T>() + omp_get_thread_num() * 2 * tile;
    T* ds_low = std::is_same_v<T, float> ? nullptr : p_low + tile;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < items; ++t) {
      try {
        const int64_t b = t / d.Hkv, g = t % d.Hkv;
        std::fill(dk_acc, dk_acc + d.Skv * (d.Dqk + d.Dv), 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int64_t i0 = 0; i0 < d.Sq; i0 += kQueryTile) {
            const int64_t rows = std::min(kQueryTile, d.Sq - i0);
            const T* q_rows = q + ((b * d.Sq + i0) * d.H + h) * d.Dqk;
            const T* do_rows = dout + ((b * d.Sq + i0) * d.H + h) * d.Dv;
            for (int64_t i = 0; i < rows; ++i) {
              const T* orow = o + ((b * d.Sq + i0 + i) * d.H + h) * d.Dv;
              float sum = 0;
              for (int64_t c = 0; c < d.Dv; ++c) sum += load(do_rows[i * d.H * d.Dv + c]) * load(orow[c]);
              delta[i] = sum, lse_i[i] = lse[(b * d.H + h) * d.Sq + i0 + i];
            }
            std::fill(dq_acc, dq_acc + rows * d.Dqk, 0.0f);
            for (int64_t j0 = 0; j0 < d.Skv; j0 += kKeyTile) {
              const int64_t cols = std::min(kKeyTile, d.Skv - j0);
              const T* k_rows = k + ((b * d.Skv + j0) * d.Hkv + g) * d.Dqk;
              const T* v_rows = v + ((b * d.Skv + j0) * d.Hkv + g) * d.Dv;
              tile_gemm(p, kKeyTile, q_rows, d.H * d.Dqk, k_rows, d.Hkv * d.Dqk, ab, rows, cols, d.Dqk, false, true,
                        float(d.scale), 0);
              tile_gemm(ds, kKeyTile, do_rows, d.H * d.Dv, v_rows, d.Hkv * d.Dv, ab, rows, cols, d.Dv, false, true, 1, 0);
              TITAN_CPU_KERNEL(probability_rows)(p, ds, kKeyTile, rows, cols, lse_i, delta);  // P; dS = P (dP - D)
              const void* p_op = operand(p, p_low, rows, cols);
              const void* ds_op = operand(ds, ds_low, rows, cols);
              // dv += P^T dO;  dk += scale dS^T q;  dq += scale dS k
              tile_gemm(dv_acc + j0 * d.Dv, d.Dv, p_op, kKeyTile, do_rows, d.H * d.Dv, ab, cols, d.Dv, rows, true,
                        false, 1, 1);
              tile_gemm(dk_acc + j0 * d.Dqk, d.Dqk, ds_op, kKeyTile, q_rows, d.H * d.Dqk, ab, cols, d.Dqk, rows, true,
                        false, float(d.scale), 1);
              tile_gemm(dq_acc, d.Dqk, ds_op, kKeyTile, k_rows, d.Hkv * d.Dqk, ab, rows, d.Dqk, cols, false, false,
                        float(d.scale), 1);
            }
            for (int64_t i = 0; i < rows; ++i) {
              G* out = dq + ((b * d.Sq + i0 + i) * d.H + h) * d.Dqk;
              for (int64_t c = 0; c < d.Dqk; ++c) out[c] = store<G>(load(out[c]) + dq_acc[i * d.Dqk + c]);
            }
          }
        }
        for (int64_t j = 0; j < d.Skv; ++j) {
          G* dk_row = dk + ((b * d.Skv + j) * d.Hkv + g) * d.Dqk;
          G* dv_row = dv + ((b * d.Skv + j) * d.Hkv + g) * d.Dv;
          for (int64_t c = 0; c < d.Dqk; ++c) dk_row[c] = store<G>(load(dk_row[c]) + dk_acc[j * d.Dqk + c]);
          for (int64_t c = 0; c < d.Dv; ++c) dv_row[c] = store<G>(load(dv_row[c]) + dv_acc[j * d.Dv + c]);
        }
      } catch (...) {
        failure.record();
      }
    }
  }
  failure.rethrow();
}

}  // namespace

void attention_unmasked_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                double scale) {
  const UnmaskedAttentionParams d = unmasked_dims(q, k, v, scale);
  check_shape(o, "o", q.dtype(), {d.B, d.Sq, d.H, d.Dv});
  check_shape(lse, "lse", DType::f32, {d.B, d.H, d.Sq});
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? &forward_tiles<T> : &ref::attention_unmasked_forward<T>)(
        o.data<T>(), lse.data<float>(), q.data<T>(), k.data<T>(), v.data<T>(), d);
  });
}

void attention_unmasked_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& lse, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, double scale) {
  const UnmaskedAttentionParams d = unmasked_dims(q, k, v, scale);
  check_shape(o, "o", q.dtype(), {d.B, d.Sq, d.H, d.Dv});
  check_shape(dout, "dout", q.dtype(), {d.B, d.Sq, d.H, d.Dv});
  check_shape(lse, "lse", DType::f32, {d.B, d.H, d.Sq});
  const DType gt = dq.defined() ? dq.dtype() : q.dtype();  // q's dtype, or f32 under bf16
  TITAN_CHECK(gt == q.dtype() || gt == DType::f32,
              "attention_unmasked: gradients in " + std::string(dtype_name(gt)) + " for " +
                  std::string(dtype_name(q.dtype())) + " inputs",
              "pass dq, dk, dv in the inputs' dtype, or in f32");
  check_shape(dq, "dq", gt, q.shape());
  check_shape(dk, "dk", gt, k.shape());
  check_shape(dv, "dv", gt, v.shape());
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    const auto run = [&]<class G>() {
      (detail::use_fast() ? &backward_tiles<T, G> : &ref::attention_unmasked_backward<T, G>)(
          dq.data<G>(), dk.data<G>(), dv.data<G>(), lse.data<float>(), dout.data<T>(), q.data<T>(), k.data<T>(),
          v.data<T>(), o.data<T>(), d);
    };
    if (gt == DType::f32) run.template operator()<float>();
    else run.template operator()<T>();
  });
}

void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part, int64_t row0) {
  TITAN_CHECK(o.dim() == 4 && o.dtype() == DType::f32 && o.is_contiguous() && lse.dtype() == DType::f32 &&
                  lse.is_contiguous() && lse.shape() == Shape({o.size(0), o.size(2), o.size(1)}),
              "attention_merge: running o " + o.str() + " and lse " + lse.str() + " must be f32 [B, L, H, Dv] and [B, H, L]",
              "keep the running result in f32");
  const int64_t B = o.size(0), L = o.size(1), H = o.size(2), Dv = o.size(3), Lp = o_part.dim() == 4 ? o_part.size(1) : -1;
  detail::check_activation(o_part, "attention_merge", "o_part");
  TITAN_CHECK(o_part.shape() == Shape({B, Lp, H, Dv}) && lse_part.dtype() == DType::f32 && lse_part.is_contiguous() &&
                  lse_part.shape() == Shape({B, H, Lp}) && row0 >= 0 && row0 + Lp <= L,
              "attention_merge: part o " + o_part.str() + " and lse " + lse_part.str() + " at row " +
                  std::to_string(row0) + " do not fit o " + o.str(),
              "o_part is [B, Lp, H, Dv] and lse_part f32 [B, H, Lp] for rows [row0, row0 + Lp) of o");
  float* out = o.data<float>();
  float* lse_out = lse.data<float>();
  const float* lse_in = lse_part.data<float>();
  detail::dispatch_activation(o_part.dtype(), [&]<class T>() {
    const T* in = o_part.data<T>();
    parallel_for(0, B * H * Lp, 256, [&](int64_t lo, int64_t hi) {
      for (int64_t x = lo; x < hi; ++x) {
        const int64_t b = x / (H * Lp), h = x / Lp % H, i = x % Lp;
        float& a = lse_out[(b * H + h) * L + row0 + i];
        const float c = lse_in[(b * H + h) * Lp + i];
        const float m = std::max(a, c);
        if (m == -INFINITY) continue;  // neither side has a key
        const float merged = m + std::log(std::exp(a - m) + std::exp(c - m));
        const float wa = std::exp(a - merged), wc = std::exp(c - merged);
        float* orow = out + ((b * L + row0 + i) * H + h) * Dv;
        const T* prow = in + ((b * Lp + i) * H + h) * Dv;
        for (int64_t col = 0; col < Dv; ++col) orow[col] = wa * orow[col] + wc * load(prow[col]);
        a = merged;
      }
    });
  });
}

}  // namespace titan::kernels
