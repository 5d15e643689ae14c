// Shared helpers for kernel tests: random inputs, running under every ISA level, comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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
  double max_abs = 0;    // max |a - b|
  double max_scaled = 0; // max |a - b| / (atol + rtol |b|): <= 1 means within tolerance
  int64_t worst = -1;    // index of the worst element
  int64_t nonfinite = 0; // elements where exactly one side is inf/nan
};

inline ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol) {
  ErrorStats s;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool fg = std::isfinite(got[i]), fw = std::isfinite(want[i]);
    if (fg != fw) {
      ++s.nonfinite;
      s.worst = int64_t(i);
      continue;
    }
    if (!fw) continue;
    const double d = std::fabs(got[i] - want[i]);
    const double scaled = d / (atol + rtol * std::fabs(want[i]));
    s.max_abs = std::max(s.max_abs, d);
    if (scaled > s.max_scaled) {
      s.max_scaled = scaled;
      s.worst = int64_t(i);
    }
  }
  return s;
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
