// ||a - b|| / ||b|| (Frobenius, in double) of two f32 tensors of one shape, strided or not: how
// the golden tests compare a tensor as a whole. A reference of norm 0 gives ||a|| instead.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "titan/core/tensor.h"

namespace titan::test {

inline double relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel()) << a.shape().str() << " against " << b.shape().str();
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < std::min(ac.numel(), bc.numel()); ++i) {
    const double d = double(ac.data<float>()[i]) - double(bc.data<float>()[i]);
    diff += d * d, norm += double(bc.data<float>()[i]) * double(bc.data<float>()[i]);
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace titan::test
