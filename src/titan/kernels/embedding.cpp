#include "titan/kernels/embedding.h"

#include <string>

#include "titan/kernels/cpu/embedding.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/gather.h"
#include "titan/kernels/ref/embedding.h"
#include "titan/kernels/row_buckets.h"

namespace titan::kernels {

namespace {

constexpr const char* kBadIdHint =
    "the tokenizer produced an id the model has no row for: check model.vocab_size against the tokenizer's "
    "vocabulary (including added special tokens)";

// Validates shapes and ids; returns (N, D).
std::pair<int64_t, int64_t> check(const char* op, const Tensor& table, const Tensor& act, const Tensor& ids) {
  TITAN_CHECK(table.dim() == 2 && table.dtype() == DType::f32 && table.is_contiguous(),
              std::string(op) + ": the table must be contiguous f32 [V, D], got " + table.str(),
              "embedding tables (and their gradients) are f32 weights");
  const int64_t d = table.size(1);
  TITAN_CHECK(act.dim() >= 1 && act.size(-1) == d && act.is_contiguous() &&
                  (act.dtype() == DType::f32 || act.dtype() == DType::bf16),
              std::string(op) + ": activations must be contiguous f32/bf16 [..., " + std::to_string(d) + "], got " +
                  act.str(),
              "the last dim is the table's row length");
  const int64_t n = act.numel() / std::max<int64_t>(d, 1);
  TITAN_CHECK(ids.numel() == n,
              std::string(op) + ": " + std::to_string(ids.numel()) + " ids for " + std::to_string(n) + " rows",
              "ids must have the activation's shape without its last dim");
  check_row_indices(ids, table.size(0), op, "token id", "the vocabulary", kBadIdHint);
  return {n, d};
}

}  // namespace

void embedding_forward(Tensor& y, const Tensor& table, const Tensor& ids) {
  const auto [n, d] = check("embedding_forward", table, y, ids);
  const bool fast = kernel_backend() == KernelBackend::fast;
  const int32_t* ip = ids.data<int32_t>();
  if (y.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(embedding_forward<float>) : &ref::embedding_forward<float>)(y.data<float>(),
                                                                                          table.data<float>(), ip, n, d);
  } else {
    (fast ? TITAN_CPU_KERNEL(embedding_forward<bf16>) : &ref::embedding_forward<bf16>)(y.data<bf16>(),
                                                                                        table.data<float>(), ip, n, d);
  }
}

void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids) {
  const auto [n, d] = check("embedding_backward", dtable, dy, ids);
  const int32_t* ip = ids.data<int32_t>();
  if (kernel_backend() == KernelBackend::reference) {
    if (dy.dtype() == DType::f32) {
      ref::embedding_backward<float>(dtable.data<float>(), dy.data<float>(), ip, n, d);
    } else {
      ref::embedding_backward<bf16>(dtable.data<float>(), dy.data<bf16>(), ip, n, d);
    }
    return;
  }
  const RowBuckets by_id = bucket_rows_by_index(ip, n, dtable.size(0));
  if (dy.dtype() == DType::f32) {
    TITAN_CPU_KERNEL(embedding_backward<float>)(dtable.data<float>(), dy.data<float>(), by_id.view(), d);
  } else {
    TITAN_CPU_KERNEL(embedding_backward<bf16>)(dtable.data<float>(), dy.data<bf16>(), by_id.view(), d);
  }
}

}  // namespace titan::kernels
