// A seeded N(0, std^2) f32 tensor for tests: the values of init_normal under `tag`, so two tests
// (or two calls with different seeds) draw different numbers.
#pragma once

#include <string>

#include "titan/core/rng.h"
#include "titan/core/tensor.h"

namespace titan::test {

inline Tensor normal(const Shape& shape, uint64_t seed, const std::string& tag, double std = 1) {
  Tensor t = Tensor::empty(shape, DType::f32);
  init_normal(t, seed, tag, 0, std);
  return t;
}

}  // namespace titan::test
