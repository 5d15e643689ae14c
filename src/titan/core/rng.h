// Counter-based random numbers (Philox-4x32-10). A value depends only on (key, counter), so
// element i of a named tensor gets the same value however the tensor is sharded, and a stream's
// whole state is two integers that a checkpoint can store.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "titan/core/shape.h"

namespace titan {

class Tensor;

// Philox-4x32 with 10 rounds (Salmon et al., SC'11): four 32-bit outputs per 128-bit counter.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_lo, uint64_t counter_hi = 0);

// Key of the stream for a named tensor: xxh64 of the name, seeded with the run seed.
uint64_t rng_key(uint64_t seed, std::string_view name);

// Uniform in [0, 1) from 32 random bits (24 bits of precision, never 1.0).
inline float uniform01(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

// A stream for sampling and shuffling: draw n consumes n counters. State is (key, offset).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0, std::string_view stream = "default");
  uint32_t next_u32();
  uint64_t next_u64();
  float next_uniform();                 // [0, 1)
  uint64_t next_below(uint64_t bound);  // uniform integer in [0, bound)
  uint64_t key() const { return key_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t key, uint64_t offset) { key_ = key, offset_ = offset; }

 private:
  uint64_t key_;
  uint64_t offset_ = 0;
};

// Initializers: element with global row-major index g gets a value drawn from counter g of the
// stream rng_key(seed, name). `slice` defaults to "the tensor is the whole tensor".
void init_uniform(Tensor& t, uint64_t seed, std::string_view name, double low, double high,
                  const GlobalSlice* slice = nullptr);
void init_normal(Tensor& t, uint64_t seed, std::string_view name, double mean, double std,
                 const GlobalSlice* slice = nullptr);
// Normal(mean, std) truncated to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_),
// sampled by inverting the CDF so each element still uses exactly one counter.
void init_trunc_normal(Tensor& t, uint64_t seed, std::string_view name, double mean, double std, double a,
                       double b, const GlobalSlice* slice = nullptr);

// Inverse of the standard normal CDF (for |p - 0.5| < 0.5), accurate to ~1e-15.
double normal_quantile(double p);

}  // namespace titan
