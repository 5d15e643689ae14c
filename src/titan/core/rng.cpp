#include "titan/core/rng.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "titan/core/tensor.h"

namespace titan {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c0;
    const uint64_t p1 = uint64_t(kM1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

uint64_t rng_key(uint64_t seed, std::string_view name) { return XXH64(name.data(), name.size(), seed); }

Generator::Generator(uint64_t seed, std::string_view stream) : key_(rng_key(seed, stream)) {}
uint32_t Generator::next_u32() { return philox4x32(key_, offset_++)[0]; }
uint64_t Generator::next_u64() {
  const auto r = philox4x32(key_, offset_++);
  return uint64_t(r[0]) | uint64_t(r[1]) << 32;
}
float Generator::next_uniform() { return uniform01(next_u32()); }
uint64_t Generator::next_below(uint64_t bound) {
  // Lemire's multiply-shift on 64 bits; the bias is below 2^-32 for bounds under 2^32.
  return uint64_t((__uint128_t(next_u64()) * bound) >> 64);
}

double normal_quantile(double p) {
  // Acklam's rational approximation, refined by one Halley step on erfc.
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01,  -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - 0.02425) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::numbers::sqrt2) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

namespace {

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

// Calls f(local_linear_index, global_linear_index) for every element of t.
template <class F>
void for_each_global_index(const Tensor& t, const GlobalSlice* slice, F&& f) {
  const int64_t n = t.numel();
  if (!slice) {
    for (int64_t i = 0; i < n; ++i) f(i, i);
    return;
  }
  const Shape& shape = t.shape();
  TITAN_CHECK(slice->global_shape.size() == shape.size() && slice->offsets.size() == shape.size(),
              "GlobalSlice rank does not match the tensor's");
  const Shape gstrides = contiguous_strides(slice->global_shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, g = 0;
    for (int dd = shape.size() - 1; dd >= 0; --dd) {
      const int64_t idx = rem % shape[dd];
      rem /= shape[dd];
      g += (idx + slice->offsets[dd]) * gstrides[dd];
    }
    f(i, g);
  }
}

template <class Sample>
void init_with(Tensor& t, uint64_t seed, std::string_view name, const GlobalSlice* slice, Sample&& sample) {
  TITAN_CHECK(t.is_contiguous() && dtype_is_float(t.dtype()), "initializers need a contiguous float tensor");
  const uint64_t key = rng_key(seed, name);
  void* data = t.data_ptr();
  const DType dt = t.dtype();
  if (dt == DType::f32) {
    float* f = static_cast<float*>(data);
    for_each_global_index(t, slice, [&](int64_t i, int64_t g) { f[i] = float(sample(philox4x32(key, uint64_t(g)))); });
  } else {
    for_each_global_index(t, slice, [&](int64_t i, int64_t g) {
      store_from_double(data, dt, i, sample(philox4x32(key, uint64_t(g))));
    });
  }
}

// Uniform in the open interval (0, 1) with 53 bits, from two 32-bit words.
double open_uniform(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (uint64_t(hi) << 21) ^ uint64_t(lo >> 11);  // 53 bits
  return (double(bits & ((1ull << 53) - 1)) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

void init_uniform(Tensor& t, uint64_t seed, std::string_view name, double low, double high, const GlobalSlice* slice) {
  init_with(t, seed, name, slice, [&](const std::array<uint32_t, 4>& r) {
    return low + (high - low) * (open_uniform(r[0], r[1]) - 0.5 / 9007199254740992.0);
  });
}

void init_normal(Tensor& t, uint64_t seed, std::string_view name, double mean, double std, const GlobalSlice* slice) {
  init_with(t, seed, name, slice, [&](const std::array<uint32_t, 4>& r) {
    const double u1 = open_uniform(r[0], r[1]), u2 = open_uniform(r[2], r[3]);
    return mean + std * std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
  });
}

void init_trunc_normal(Tensor& t, uint64_t seed, std::string_view name, double mean, double std, double a, double b,
                       const GlobalSlice* slice) {
  TITAN_CHECK(a < b && std > 0, "trunc_normal needs a < b and std > 0");
  const double pa = normal_cdf((a - mean) / std), pb = normal_cdf((b - mean) / std);
  init_with(t, seed, name, slice, [&](const std::array<uint32_t, 4>& r) {
    const double p = pa + (pb - pa) * open_uniform(r[0], r[1]);
    return std::clamp(mean + std * normal_quantile(p), a, b);
  });
}

}  // namespace titan
