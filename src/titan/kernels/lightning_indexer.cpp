#include "titan/kernels/lightning_indexer.h"

#include <cmath>
#include <string>

#include "titan/kernels/cpu/lightning_indexer.h"
#include "titan/kernels/dsa_params.h"
#include "titan/kernels/ref/lightning_indexer.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

constexpr const char* kLayouts =
    "layouts: q [B, S, HI, DI], k [B, Skv, DI], w [B, S, HI] f32, idx [B, S, K] i32, target [B, S, K] f32, "
    "mq [B, S, H, D], mk [B, Skv, Hk, D], mlse [B, S, H] f32";

void check_tensor(const Tensor& t, const char* op, const char* name, DType dtype, const Shape& shape) {
  TITAN_CHECK(t.defined(), std::string(op) + ": " + name + " is undefined",
              "allocate it, e.g. Tensor::empty(" + shape.str() + ", " + std::string(dtype_name(dtype)) + ")");
  TITAN_CHECK(t.shape() == shape,
              std::string(op) + ": " + name + " has shape " + t.shape().str() + ", expected " + shape.str(), kLayouts);
  TITAN_CHECK(t.dtype() == dtype,
              std::string(op) + ": " + name + " is " + std::string(dtype_name(t.dtype())) + ", expected " +
                  std::string(dtype_name(dtype)),
              "q, k, mq, mk and the gradients dq, dk share one dtype (f32 or bf16); w, dw, mlse and target are f32; idx is i32");
  TITAN_CHECK(t.is_contiguous(), std::string(op) + ": " + name + " must be contiguous", "call .contiguous() first");
}

// Sizes from q [B, S, HI, DI] and k [B, Skv, DI], with the checks every entry point shares.
IndexerParams indexer_dims(const Tensor& q, const Tensor& k, const Tensor& w, const char* op, int64_t ratio = 1,
                           int64_t pos0 = 0) {
  TITAN_CHECK(q.defined() && k.defined(), std::string(op) + ": q or k is undefined", "pass allocated tensors");
  TITAN_CHECK(q.dim() == 4 && k.dim() == 3,
              std::string(op) + ": q must be 4-d and k 3-d, got " + q.shape().str() + " and " + k.shape().str(),
              kLayouts);
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              std::string(op) + ": dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast the indexer's q and k to f32 or bf16");
  IndexerParams d;
  d.B = q.size(0), d.S = q.size(1), d.HI = q.size(2), d.DI = q.size(3), d.Skv = k.size(1);
  TITAN_CHECK(d.B > 0 && d.S > 0 && d.HI > 0 && d.DI > 0,
              std::string(op) + ": empty dimension in q " + q.shape().str(), "every size must be at least 1");
  d.ratio = ratio, d.P0 = pos0;
  TITAN_CHECK(pos0 == 0 || (ratio > 1 && pos0 > 0),
              std::string(op) + ": first query position " + std::to_string(pos0) + " with ratio " +
                  std::to_string(ratio),
              "a first query position applies to compressed entries (ratio > 1) and is >= 0; raw keys place the "
              "queries as the last S of Skv instead");
  TITAN_CHECK(ratio >= 1, std::string(op) + ": ratio " + std::to_string(ratio) + " is below 1",
              "pass 1 for raw keys, or the compressor's ratio m for compressed entries");
  TITAN_CHECK((ratio > 1 || d.Skv >= d.S) && d.Skv <= INT32_MAX,
              std::string(op) + ": Skv = " + std::to_string(d.Skv) + " keys for S = " + std::to_string(d.S) +
                  " queries",
              "raw keys: the queries are the last S of the Skv key positions, so Skv >= S (and below 2^31 for i32 "
              "indices)");
  check_tensor(q, op, "q", q.dtype(), {d.B, d.S, d.HI, d.DI});
  check_tensor(k, op, "k", q.dtype(), {d.B, d.Skv, d.DI});
  check_tensor(w, op, "w", DType::f32, {d.B, d.S, d.HI});
  return d;
}

}  // namespace

void indexer_topk(Tensor& idx, const Tensor& q, const Tensor& k, const Tensor& w, int64_t ratio, int64_t pos0) {
  IndexerParams d = indexer_dims(q, k, w, "indexer_topk", ratio, pos0);
  TITAN_CHECK(idx.defined() && idx.dim() == 3, "indexer_topk: idx must be a 3-d i32 tensor [B, S, K]",
              "allocate Tensor::empty({B, S, K}, DType::i32)");
  d.K = idx.size(2);
  TITAN_CHECK(d.K >= 1, "indexer_topk: idx has K = 0 slots per row", "top-k needs K >= 1");
  check_tensor(idx, "indexer_topk", "idx", DType::i32, {d.B, d.S, d.K});
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(indexer_topk<T>) : &ref::indexer_topk<T>)(
        idx.data<int32_t>(), q.data<T>(), k.data<T>(), w.data<float>(), d);
  });
}

namespace {

// Checks the gradients and grad_scale both loss entry points share.
void check_loss_outputs(const Tensor& dq, const Tensor& dk, const Tensor& dw, const Tensor& q, const Tensor& k,
                        const Tensor& w, double grad_scale, const char* op) {
  check_tensor(dq, op, "dq", q.dtype(), q.shape());
  check_tensor(dk, op, "dk", q.dtype(), k.shape());
  check_tensor(dw, op, "dw", DType::f32, w.shape());
  TITAN_CHECK(std::isfinite(grad_scale),
              std::string(op) + ": grad_scale " + std::to_string(grad_scale) + " is not finite",
              "pass the loss weight (1 for a plain sum, 1 / rows for a mean)");
}

}  // namespace

double indexer_kl_loss(Tensor& dq, Tensor& dk, Tensor& dw, const Tensor& q, const Tensor& k, const Tensor& w,
                       const Tensor& mq, const Tensor& mk, const Tensor& mlse, double scale, double grad_scale) {
  const char* op = "indexer_kl_loss";
  const IndexerParams d = indexer_dims(q, k, w, op);
  TITAN_CHECK(mq.defined() && mk.defined() && mq.dim() == 4 && mk.dim() == 4,
              std::string(op) + ": mq and mk must be 4-d", kLayouts);
  IndexerTargetParams td;
  td.H = mq.size(2), td.D = mq.size(3), td.Hk = mk.size(2), td.scale = scale;
  TITAN_CHECK(td.H > 0 && td.Hk > 0 && td.D > 0 && td.H % td.Hk == 0,
              std::string(op) + ": " + std::to_string(td.H) + " main query heads do not split into " +
                  std::to_string(td.Hk) + " key heads",
              "mk has Hk = 1 (absorbed MQA form) or Hk = H (standard MLA) heads; H must be a multiple of Hk");
  check_tensor(mq, op, "mq", q.dtype(), {d.B, d.S, td.H, td.D});
  check_tensor(mk, op, "mk", q.dtype(), {d.B, d.Skv, td.Hk, td.D});
  check_tensor(mlse, op, "mlse", DType::f32, {d.B, d.S, td.H});
  check_loss_outputs(dq, dk, dw, q, k, w, grad_scale, op);
  TITAN_CHECK(std::isfinite(scale), std::string(op) + ": scale " + std::to_string(scale) + " is not finite",
              "pass the main attention's softmax scale");
  double loss = 0;
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    if (detail::use_fast()) {
      loss = TITAN_CPU_KERNEL(indexer_kl_loss<T>)(dq.data<T>(), dk.data<T>(), dw.data<float>(), q.data<T>(),
                                                  k.data<T>(), w.data<float>(), mq.data<T>(), mk.data<T>(),
                                                  mlse.data<float>(), d, td, grad_scale);
    } else {
      loss = ref::indexer_kl_loss<T>(dq.data<T>(), dk.data<T>(), dw.data<float>(), q.data<T>(), k.data<T>(),
                                     w.data<float>(), mq.data<T>(), mk.data<T>(), mlse.data<float>(), nullptr, d, td,
                                     grad_scale);
    }
  });
  return loss;
}

double indexer_kl_loss_sparse(Tensor& dq, Tensor& dk, Tensor& dw, const Tensor& q, const Tensor& k, const Tensor& w,
                              const Tensor& idx, const Tensor& target, double grad_scale, int64_t ratio,
                              int64_t pos0) {
  const char* op = "indexer_kl_loss_sparse";
  IndexerParams d = indexer_dims(q, k, w, op, ratio, pos0);
  TITAN_CHECK(idx.defined() && idx.dim() == 3, std::string(op) + ": idx must be a 3-d i32 tensor [B, S, K]",
              "pass indexer_topk's output (the dense warm-up stage uses indexer_kl_loss)");
  d.K = idx.size(2);
  check_tensor(idx, op, "idx", DType::i32, {d.B, d.S, d.K});
  check_tensor(target, op, "target", DType::f32, {d.B, d.S, d.K});
  check_loss_outputs(dq, dk, dw, q, k, w, grad_scale, op);
  double loss = 0;
  detail::dispatch_activation(q.dtype(), [&]<class T>() {
    loss = (detail::use_fast() ? TITAN_CPU_KERNEL(indexer_kl_loss_sparse<T>) : &ref::indexer_kl_loss_sparse<T>)(
        dq.data<T>(), dk.data<T>(), dw.data<float>(), q.data<T>(), k.data<T>(), w.data<float>(), idx.data<int32_t>(),
        target.data<float>(), d, grad_scale);
  });
  return loss;
}

void hadamard_transform(Tensor& x) {
  detail::check_activation(x, "hadamard_transform", "x");
  const int64_t n = detail::last_dim(x, "hadamard_transform");
  TITAN_CHECK((n & (n - 1)) == 0,
              "hadamard_transform: the last dim " + std::to_string(n) + " of " + x.str() + " is not a power of two",
              "the Sylvester Hadamard matrix exists for n = 2^m (the indexer uses DI = 128)");
  detail::dispatch_activation(x.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(hadamard_transform<T>) : &ref::hadamard_transform<T>)(x.data<T>(),
                                                                                               x.numel() / n, n);
  });
}

}  // namespace titan::kernels
