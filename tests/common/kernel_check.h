// Shared helpers for kernel tests: random inputs, running under every ISA level, comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "titan/core/cpu_features.h"
#include "titan/core/dtype.h"
#include "titan/core/rng.h"
#include "titan/core/tensor.h"

namespace titan::test {

// A tensor of uniform values in [lo, hi), reproducible from (seed, name).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, std::string_view name, double lo = -1,
                            double hi = 1) {
  Tensor t = Tensor::empty(shape, DType::f32);
  init_uniform(t, seed, name, lo, hi);
  return dtype == DType::f32 ? t : t.to(dtype);
}

// Values of any float tensor as doubles (row-major).
inline std::vector<double> to_doubles(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<double> v(size_t(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) v[size_t(i)] = load_as_double(c.data_ptr(), c.dtype(), i);
  return v;
}

struct ErrorStats {
  double max_abs = 0;     // max |a - b| over the elements finite on both sides
  double max_rel = 0;     // max |a - b| / |b| over those with b != 0
  double max_scaled = 0;  // max |a - b| / (atol + rtol |b|): <= 1 means within tolerance; inf on a non-finite mismatch
  double nmse = 0;        // sum (a - b)^2 / sum b^2 over the finite elements (0 when both sums are 0)
  int64_t worst = -1;     // the first non-finite mismatch if there is one, else the element of max_scaled
  int64_t nonfinite = 0;  // elements where a non-finite value is not matched exactly (see compare)
  int64_t want_nan = 0;   // elements where b is NaN (matched or not)
};

// Finite elements must agree within atol + rtol |b|; a non-finite one only matches itself: NaN
// matches NaN, +inf only +inf and -inf only -inf (a mismatch makes max_scaled infinite, so a
// check of max_scaled alone catches it too).
inline ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol) {
  ErrorStats s;
  double sum_d2 = 0, sum_b2 = 0;
  int64_t first_mismatch = -1, worst_finite = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i], b = want[i];
    s.want_nan += std::isnan(b);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b;  // equal infinities
      if (!same) {
        ++s.nonfinite;
        if (first_mismatch < 0) first_mismatch = int64_t(i);
      }
      continue;
    }
    const double d = std::fabs(a - b);
    sum_d2 += d * d;
    sum_b2 += b * b;
    s.max_abs = std::max(s.max_abs, d);
    if (b != 0) s.max_rel = std::max(s.max_rel, d / std::fabs(b));
    if (d == 0) continue;
    const double tol = atol + rtol * std::fabs(b);
    const double scaled = tol > 0 ? d / tol : std::numeric_limits<double>::infinity();
    if (worst_finite < 0 || scaled > s.max_scaled) {
      s.max_scaled = scaled;
      worst_finite = int64_t(i);
    }
  }
  s.nmse = sum_b2 > 0 ? sum_d2 / sum_b2 : (sum_d2 > 0 ? std::numeric_limits<double>::infinity() : 0);
  if (first_mismatch >= 0) s.max_scaled = std::numeric_limits<double>::infinity();
  s.worst = first_mismatch >= 0 ? first_mismatch : worst_finite;
  return s;
}

// "max_abs=… max_rel=… nmse=… (x… of tolerance), worst element i: got g, want w[, N non-finite
// mismatches]": the numbers a failed comparison is judged by.
inline std::string error_report(const ErrorStats& e, const std::vector<double>& got, const std::vector<double>& want) {
  std::ostringstream os;
  os << std::setprecision(4) << "max_abs=" << e.max_abs << " max_rel=" << e.max_rel << " nmse=" << e.nmse << " (x"
     << e.max_scaled << " of tolerance)";
  if (e.worst >= 0) {
    const size_t w = size_t(e.worst);
    os << std::setprecision(9) << ", worst element " << w << ": got " << got[w] << ", want " << want[w];
  }
  if (e.nonfinite) os << ", " << e.nonfinite << " non-finite mismatches";
  return os.str();
}

// Runs f once per ISA level this CPU supports (restoring the level after), passing the level.
// On a CPU with AMX the avx512_bf16 level runs twice: with AMX, then with it switched off (the
// AVX512-BF16 kernels of CPUs without it). isa_label() names the current run in messages.
inline void for_each_isa(const std::function<void(CpuCapability)>& f) {
  const CpuCapability saved = cpu_capability();
  for (int level = 0; level <= int(cpu_capability_detected()); ++level) {
    set_cpu_capability(CpuCapability(level));
    f(CpuCapability(level));
    if (CpuCapability(level) == CpuCapability::avx512_bf16 && cpu_amx_bf16_usable()) {
      set_cpu_amx_enabled(false);
      f(CpuCapability(level));
      set_cpu_amx_enabled(true);
    }
  }
  set_cpu_capability(saved);
}

inline std::string isa_label(CpuCapability isa) {
  std::string s(cpu_capability_name(isa));
  if (isa == CpuCapability::avx512_bf16 && cpu_amx_bf16_detected()) s += cpu_amx_bf16_usable() ? "+amx" : "-amx";
  return s;
}

}  // namespace titan::test
