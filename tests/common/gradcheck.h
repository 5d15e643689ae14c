// Finite-difference gradient checks in double precision. Kernels' reference twins are
// instantiated for double, so both the analytic backward and the numeric one run in double.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "titan/core/rng.h"

namespace titan::test {

using Doubles = std::vector<double>;

// forward(inputs) -> outputs (all flattened). backward(inputs, d_outputs) -> d_inputs (one per
// input; an empty vector means "not differentiable w.r.t. this input" and is skipped).
// The scalar checked is L = sum_k outputs[k] . probe[k] with a fixed random probe, so every
// output element's gradient path is exercised. Central differences with step eps.
inline void gradcheck(const std::string& name, std::vector<Doubles> inputs,
                      const std::function<std::vector<Doubles>(const std::vector<Doubles>&)>& forward,
                      const std::function<std::vector<Doubles>(const std::vector<Doubles>&, const std::vector<Doubles>&)>& backward,
                      double eps = 1e-6, double tol = 1e-6) {
  const std::vector<Doubles> out0 = forward(inputs);
  std::vector<Doubles> probe(out0.size());
  Generator g(1234, name);
  for (size_t k = 0; k < out0.size(); ++k) {
    probe[k].resize(out0[k].size());
    for (double& p : probe[k]) p = 2.0 * g.next_uniform() - 1.0;
  }
  auto loss = [&](const std::vector<Doubles>& in) {
    const std::vector<Doubles> out = forward(in);
    double l = 0;
    for (size_t k = 0; k < out.size(); ++k)
      for (size_t i = 0; i < out[k].size(); ++i) l += out[k][i] * probe[k][i];
    return l;
  };
  const std::vector<Doubles> analytic = backward(inputs, probe);
  ASSERT_EQ(analytic.size(), inputs.size()) << name;
  for (size_t a = 0; a < inputs.size(); ++a) {
    if (analytic[a].empty()) continue;
    ASSERT_EQ(analytic[a].size(), inputs[a].size()) << name << " input " << a;
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < inputs[a].size(); ++i) {
      const double saved = inputs[a][i];
      inputs[a][i] = saved + eps;
      const double lp = loss(inputs);
      inputs[a][i] = saved - eps;
      const double lm = loss(inputs);
      inputs[a][i] = saved;
      const double numeric = (lp - lm) / (2 * eps);
      const double err = std::fabs(numeric - analytic[a][i]) / (1.0 + std::fabs(numeric));
      if (err > worst) worst = err, worst_i = i;
    }
    EXPECT_LE(worst, tol) << name << ": gradient of input " << a << " element " << worst_i
                          << " differs from central differences by " << worst;
  }
}

// n uniform values in [lo, hi), reproducible from (seed, name).
inline Doubles random_doubles(size_t n, uint64_t seed, std::string_view name, double lo = -1, double hi = 1) {
  Doubles v(n);
  const uint64_t key = rng_key(seed, name);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * uniform01(philox4x32(key, i)[0]);
  return v;
}

}  // namespace titan::test
