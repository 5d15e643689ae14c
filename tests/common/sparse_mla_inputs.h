// Index inputs for the sparse MLA tests: top-k style rows of distinct key positions, with the
// invalid entries the kernels must ignore (dsa_params.h: -1 padding, >= Skv, future keys).
#pragma once

#include <cstdint>
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "titan/core/rng.h"
#include "titan/core/tensor.h"

namespace titan::test {

struct SparseIdxOptions {
  bool causal_only = true;  // draw keys from the query's causal candidates only (as top-k does)
  double p_pad = 0;         // chance that a slot is overwritten with -1
};

// idx [B, S, K] i32. Row t draws min(K, pool) distinct keys in random slot order from its pool:
// its causal candidates [0, t + Skv - S] or, without causal_only, all of [0, Skv) (so future keys
// appear). Slots beyond the pool get -1 or Skv + j, alternately.
inline Tensor random_sparse_idx(int64_t B, int64_t S, int64_t Skv, int64_t K, uint64_t seed, const std::string& name,
                                SparseIdxOptions opt = {}) {
  Tensor idx = Tensor::empty({B, S, K}, DType::i32);
  int32_t* out = idx.data<int32_t>();
  Generator g(seed, name);
  std::vector<int32_t> pool, row(static_cast<size_t>(K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S; ++t) {
      const int64_t n = opt.causal_only ? t + Skv - S + 1 : Skv;
      pool.resize(size_t(n));
      std::iota(pool.begin(), pool.end(), 0);
      for (int64_t j = 0; j < K; ++j) {
        if (j < n) {  // partial Fisher-Yates: slot j takes a random key not yet taken
          std::swap(pool[size_t(j)], pool[size_t(j + int64_t(g.next_below(uint64_t(n - j))))]);
          row[size_t(j)] = pool[size_t(j)];
        } else {
          row[size_t(j)] = j % 2 ? -1 : int32_t(Skv + j);
        }
        if (opt.p_pad > 0 && g.next_uniform() < opt.p_pad) row[size_t(j)] = -1;
      }
      for (int64_t j = K - 1; j > 0; --j) std::swap(row[size_t(j)], row[size_t(g.next_below(uint64_t(j + 1)))]);
      std::copy(row.begin(), row.end(), out + (b * S + t) * K);
    }
  }
  return idx;
}

}  // namespace titan::test
