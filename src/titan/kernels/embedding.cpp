#include "titan/kernels/embedding.h"

#include <string>

#include "titan/kernels/cpu/embedding.h"
#include "titan/kernels/gather.h"
#include "titan/kernels/ref/embedding.h"
#include "titan/kernels/row_buckets.h"
#include "titan/kernels/tensor_checks.h"

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
  detail::check_activation(act, op, "activations");
  TITAN_CHECK(act.dim() >= 1 && act.size(-1) == d,
              std::string(op) + ": activations must be [..., " + std::to_string(d) + "], got " + act.str(),
              "the last dim is the table's row length");
  const int64_t n = act.numel() / std::max<int64_t>(d, 1);
  TITAN_CHECK(ids.numel() == n,
              std::string(op) + ": " + std::to_string(ids.numel()) + " ids for " + std::to_string(n) + " rows",
              "ids must have the activation's shape without its last dim");
  check_row_indices(ids, table.size(0), op, "token id", kBadIdHint, "the vocabulary");
  return {n, d};
}

}  // namespace

void embedding_forward(Tensor& y, const Tensor& table, const Tensor& ids) {
  const auto [n, d] = check("embedding_forward", table, y, ids);
  detail::dispatch_activation(y.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(embedding_forward<T>) : &ref::embedding_forward<T>)(
        y.data<T>(), table.data<float>(), ids.data<int32_t>(), n, d);
  });
}

void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids) {
  const auto [n, d] = check("embedding_backward", dtable, dy, ids);
  const int32_t* ip = ids.data<int32_t>();
  detail::dispatch_activation(dy.dtype(), [&]<class T>() {
    if (detail::use_fast()) {
      const RowBuckets by_id = bucket_rows_by_index(ip, n, dtable.size(0));
      TITAN_CPU_KERNEL(embedding_backward<T>)(dtable.data<float>(), dy.data<T>(), by_id.view(), d);
    } else {
      ref::embedding_backward<T>(dtable.data<float>(), dy.data<T>(), ip, n, d);
    }
  });
}

}  // namespace titan::kernels
