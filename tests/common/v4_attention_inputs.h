// Inputs for the DeepSeek-V4 attention tests (kernels/v4_attention.h): q, kv, the compressed
// entries, the sink and CSA slot lists, from one row of sizes {B, S, H, D, W, m, K} (K = 0: HCA,
// every visible entry; T = floor(S / m), so S < m is a sliding-only layer with no entry), or
// {B, S, H, D, W, m, K, E, P0}: a context-parallel chunk, E raw key rows before the S queries
// (Skv = E + S) and its first query at position P0 >= E (T = floor((P0 + S) / m)).
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/kernel_check.h"
#include "titan/kernels/v4_attention_params.h"

namespace titan::test {

// idx [B, S, K] i32. Row t takes min(K, pool) distinct entries in random slot order, pool = its
// visible entries [0, floor((P0 + t + 1) / m)) or, with future, all of [0, T) (future entries, which the
// kernels must drop); the other slots get -1 or T + j (past the last entry), alternately.
inline Tensor random_v4_idx(const kernels::V4AttentionParams& d, bool future, uint64_t seed, const std::string& name) {
  Tensor idx = Tensor::empty({d.B, d.S, d.K}, DType::i32);
  Generator g(seed, name);
  std::vector<int32_t> pool;
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      const int64_t n = future ? d.T : kernels::v4_visible_entries(d, t);
      pool.resize(size_t(n));
      std::iota(pool.begin(), pool.end(), 0);
      int32_t* row = idx.data<int32_t>() + (b * d.S + t) * d.K;
      for (int64_t j = 0; j < d.K; ++j) {
        if (j < n) {  // partial Fisher-Yates: slot j takes a random entry not yet taken
          std::swap(pool[size_t(j)], pool[size_t(j + int64_t(g.next_below(uint64_t(n - j))))]);
          row[j] = pool[size_t(j)];
        } else {
          row[j] = j % 2 ? -1 : int32_t(d.T + j);
        }
      }
      for (int64_t j = d.K - 1; j > 0; --j) std::swap(row[j], row[g.next_below(uint64_t(j + 1))]);
    }
  }
  return idx;
}

struct V4AttentionCase {
  kernels::V4AttentionParams d;
  Tensor q, kv, comp, idx, sink;  // idx undefined for HCA

  // dims {B, S, H, D, W, m, K[, E, P0]}; future: CSA rows also select future entries.
  V4AttentionCase(const std::vector<int64_t>& dims, DType dtype, uint64_t seed, bool future = true) {
    d.B = dims[0], d.S = dims[1], d.H = dims[2], d.D = dims[3], d.W = dims[4], d.ratio = dims[5], d.K = dims[6];
    d.Skv = d.S + (dims.size() > 7 ? dims[7] : 0), d.P0 = dims.size() > 8 ? dims[8] : 0;
    d.T = (d.P0 + d.S) / d.ratio;
    // Inputs in [-1, 1): 2 / sqrt(D) keeps the softmax peaked but not one-hot at every width.
    d.scale = 2.0 / std::sqrt(double(d.D));
    q = random_tensor({d.B, d.S, d.H, d.D}, dtype, seed, "q");
    kv = random_tensor({d.B, d.Skv, d.D}, dtype, seed, "kv");
    comp = random_tensor({d.B, d.T, d.D}, dtype, seed, "comp");
    sink = random_tensor({d.H}, DType::f32, seed, "sink", -2, 2);
    if (d.K > 0) idx = random_v4_idx(d, future, seed, "idx");
  }
};

}  // namespace titan::test
