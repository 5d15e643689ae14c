#include "titan/kernels/moe_router.h"

#include <string>

#include "titan/core/parallel.h"
#include "titan/kernels/ref/moe_router.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

int64_t check_rows(const Tensor& t, int64_t cols, DType dtype, const char* op, const char* name) {
  TITAN_CHECK(t.defined() && t.dim() == 2 && t.size(1) == cols && t.dtype() == dtype && t.is_contiguous(),
              std::string(op) + ": " + name + " must be contiguous " + std::string(dtype_name(dtype)) + " [N, " +
                  str(cols) + "], got " + (t.defined() ? t.str() : std::string("undefined")),
              "the router works on [tokens, experts] in f32 and [tokens, top_k] choices");
  return t.size(0);
}

// Rows per chunk: a token costs about E log k, so a few hundred tokens amortize a thread.
constexpr int64_t kRouterGrain = 256;

}  // namespace

void check_router_params(const RouterParams& p) {
  TITAN_CHECK(p.experts >= 1 && p.top_k >= 1 && p.top_k <= p.experts,
              "moe router: top_k " + str(p.top_k) + " of " + str(p.experts) + " experts",
              "need 1 <= n_activated_experts <= n_routed_experts");
  TITAN_CHECK(p.n_groups >= 1 && p.experts % p.n_groups == 0 && p.topk_groups >= 1 && p.topk_groups <= p.n_groups,
              "moe router: " + str(p.experts) + " experts in " + str(p.n_groups) + " groups, keeping " +
                  str(p.topk_groups),
              "n_expert_groups must divide n_routed_experts and 1 <= n_limited_groups <= n_expert_groups");
  TITAN_CHECK(p.topk_groups * p.group_size() >= p.top_k,
              "moe router: " + str(p.topk_groups) + " groups of " + str(p.group_size()) + " experts cannot supply top_k " +
                  str(p.top_k),
              "raise n_limited_groups or lower n_activated_experts");
}

void moe_router_forward(Tensor& scores, Tensor& indices, Tensor& weights, const Tensor& logits, const Tensor& bias,
                        const RouterParams& p) {
  check_router_params(p);
  const char* op = "moe_router_forward";
  const int64_t n = check_rows(logits, p.experts, DType::f32, op, "logits");
  TITAN_CHECK(check_rows(scores, p.experts, DType::f32, op, "scores") == n &&
                  check_rows(indices, p.top_k, DType::i32, op, "indices") == n &&
                  check_rows(weights, p.top_k, DType::f32, op, "weights") == n,
              std::string(op) + ": outputs disagree on the token count " + str(n), "allocate them for the same N tokens");
  if (bias.defined()) detail::check_f32(bias, p.experts, op, "bias");
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  auto rows = [&](int64_t lo, int64_t hi) {
    ref::router_forward<float>(scores.data<float>() + lo * p.experts, indices.data<int32_t>() + lo * p.top_k,
                               weights.data<float>() + lo * p.top_k, logits.data<float>() + lo * p.experts, b, hi - lo,
                               p);
  };
  if (detail::use_fast()) {
    parallel_for(0, n, kRouterGrain, rows);
  } else {
    rows(0, n);
  }
}

void moe_router_weights_forward(Tensor& scores, Tensor& weights, const Tensor& logits, const Tensor& indices,
                                const RouterParams& p) {
  check_router_params(p);
  const char* op = "moe_router_weights_forward";
  const int64_t n = check_rows(logits, p.experts, DType::f32, op, "logits");
  TITAN_CHECK(check_rows(scores, p.experts, DType::f32, op, "scores") == n &&
                  check_rows(indices, p.top_k, DType::i32, op, "indices") == n &&
                  check_rows(weights, p.top_k, DType::f32, op, "weights") == n,
              std::string(op) + ": operands disagree on the token count " + str(n), "allocate them for the same N tokens");
  const int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    TITAN_CHECK(idx[i] >= 0 && idx[i] < p.experts,
                std::string(op) + ": expert " + str(idx[i]) + " at choice " + str(i) + " of " + str(p.experts) +
                    " experts",
                "a hash table (tid2eid) holds expert ids in [0, E)");
  }
  auto rows = [&](int64_t lo, int64_t hi) {
    ref::router_weights_forward<float>(scores.data<float>() + lo * p.experts, weights.data<float>() + lo * p.top_k,
                                       logits.data<float>() + lo * p.experts, idx + lo * p.top_k, hi - lo, p);
  };
  if (detail::use_fast()) {
    parallel_for(0, n, kRouterGrain, rows);
  } else {
    rows(0, n);
  }
}

void moe_router_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dscores, const Tensor& scores,
                         const Tensor& indices, const RouterParams& p) {
  check_router_params(p);
  const char* op = "moe_router_backward";
  const int64_t n = check_rows(scores, p.experts, DType::f32, op, "scores");
  TITAN_CHECK(check_rows(dlogits, p.experts, DType::f32, op, "dlogits") == n &&
                  check_rows(indices, p.top_k, DType::i32, op, "indices") == n &&
                  check_rows(dweights, p.top_k, DType::f32, op, "dweights") == n &&
                  (!dscores.defined() || check_rows(dscores, p.experts, DType::f32, op, "dscores") == n),
              std::string(op) + ": operands disagree on the token count " + str(n), "pass the forward's tensors");
  const float* ds = dscores.defined() ? dscores.data<float>() : nullptr;
  auto rows = [&](int64_t lo, int64_t hi) {
    ref::router_backward<float>(dlogits.data<float>() + lo * p.experts, dweights.data<float>() + lo * p.top_k,
                                ds ? ds + lo * p.experts : nullptr, scores.data<float>() + lo * p.experts,
                                indices.data<int32_t>() + lo * p.top_k, hi - lo, p);
  };
  if (detail::use_fast()) {
    parallel_for(0, n, kRouterGrain, rows);
  } else {
    rows(0, n);
  }
}

namespace {
int64_t check_aux(const Tensor& scores, const Tensor& indices, int64_t batch, const RouterParams& p, const char* op) {
  check_router_params(p);
  const int64_t n = check_rows(scores, p.experts, DType::f32, op, "scores");
  TITAN_CHECK(check_rows(indices, p.top_k, DType::i32, op, "indices") == n && batch >= 1 && n % batch == 0,
              std::string(op) + ": " + str(n) + " tokens in " + str(batch) + " sequences",
              "pass the [B * S] tokens of B equal sequences, in order");
  return n / batch;
}
}  // namespace

double moe_aux_loss_forward(const Tensor& scores, const Tensor& indices, int64_t batch, const RouterParams& p) {
  const int64_t seq = check_aux(scores, indices, batch, p, "moe_aux_loss_forward");
  return ref::router_aux_loss<float>(scores.data<float>(), indices.data<int32_t>(), batch, seq, p);
}

void moe_aux_loss_backward(Tensor& dscores, double dloss, const Tensor& scores, const Tensor& indices, int64_t batch,
                           const RouterParams& p) {
  const int64_t seq = check_aux(scores, indices, batch, p, "moe_aux_loss_backward");
  TITAN_CHECK(check_rows(dscores, p.experts, DType::f32, "moe_aux_loss_backward", "dscores") == scores.size(0),
              "moe_aux_loss_backward: dscores " + dscores.str() + " for scores " + scores.str(), "allocate it like scores");
  ref::router_aux_loss_backward<float>(dscores.data<float>(), float(dloss), scores.data<float>(),
                                       indices.data<int32_t>(), batch, seq, p);
}

}  // namespace titan::kernels
