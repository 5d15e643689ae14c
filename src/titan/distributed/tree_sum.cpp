#include "titan/distributed/tree_sum.h"

#include "titan/core/error.h"

namespace titan::distributed {

namespace {

// left += right, element-wise in f32.
void add_into(const Tensor& left, const Tensor& right) {
  TITAN_CHECK(left.numel() == right.numel() && left.dtype() == DType::f32 && right.dtype() == DType::f32 &&
                  left.is_contiguous() && right.is_contiguous(),
              "TreeSum: contiguous f32 tensors of one size, got " + left.str() + " and " + right.str());
  float* a = left.data<float>();
  const float* b = right.data<float>();
  for (int64_t i = 0; i < left.numel(); ++i) a[i] += b[i];
}

}  // namespace

void TreeSum::add(const Tensor& x) {
  std::pair<int64_t, Tensor> carry{1, x};
  while (!partial_.empty() && partial_.back().first == carry.first) {
    add_into(partial_.back().second, carry.second);  // the earlier subtree on the left
    carry = {2 * carry.first, partial_.back().second};
    partial_.pop_back();
  }
  partial_.push_back(std::move(carry));
}

Tensor TreeSum::take() {
  TITAN_CHECK(!partial_.empty(), "TreeSum::take() of an empty sum");
  while (partial_.size() > 1) {
    Tensor right = partial_.back().second;
    partial_.pop_back();
    add_into(partial_.back().second, right);
  }
  Tensor out = partial_.back().second;
  partial_.clear();
  return out;
}

}  // namespace titan::distributed
