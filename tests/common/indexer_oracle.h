// A dense, materialized double-precision oracle for the lightning indexer tests (docs/dsa.md section 7,
// items 2, 3 and 6): the full [S, Skv] score matrix, the valid mask (causal, intersected with the
// selection in the sparse stage), the main attention's lse over that mask and the summed KL loss.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/gradcheck.h"
#include "titan/kernels/dsa_params.h"

namespace titan::test {

struct IndexerProblem {
  kernels::IndexerParams d;
  kernels::IndexerTargetParams td;
  Doubles q, k, w, mq, mk;  // [B, S, HI, DI], [B, Skv, DI], [B, S, HI], [B, S, H, D], [B, Skv, Hk, D]
  std::vector<int32_t> idx;  // [B, S, K]; empty = dense stage
  Doubles mlse;              // [B, S, H]: the main attention's lse over each row's valid set
};

// Key s is a candidate of query t (dsa_params.h).
inline bool causal(const kernels::IndexerParams& d, int64_t t, int64_t s) { return s >= 0 && s <= t + d.Skv - d.S; }

// I [B, S, Skv], -inf where s is not a candidate of t.
inline Doubles naive_scores(const kernels::IndexerParams& d, const Doubles& q, const Doubles& k, const Doubles& w) {
  Doubles out(size_t(d.B * d.S * d.Skv), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.S; ++t)
      for (int64_t s = 0; s < d.Skv; ++s) {
        if (!causal(d, t, s)) continue;
        double score = 0;
        for (int64_t j = 0; j < d.HI; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d.DI; ++c)
            dot += q[size_t(((b * d.S + t) * d.HI + j) * d.DI + c)] * k[size_t((b * d.Skv + s) * d.DI + c)];
          score += w[size_t((b * d.S + t) * d.HI + j)] * std::max(dot, 0.0);
        }
        out[size_t((b * d.S + t) * d.Skv + s)] = score;
      }
  return out;
}

// mask [B, S, Skv]: 1 where s is in V_t (every candidate, or the candidates listed in idx).
inline std::vector<char> valid_mask(const kernels::IndexerParams& d, const std::vector<int32_t>& idx) {
  std::vector<char> mask(size_t(d.B * d.S * d.Skv), 0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.S; ++t) {
      char* row = &mask[size_t((b * d.S + t) * d.Skv)];
      if (idx.empty()) {
        for (int64_t s = 0; s < d.Skv; ++s) row[s] = causal(d, t, s);
      } else {
        for (int64_t i = 0; i < d.K; ++i) {
          const int32_t s = idx[size_t((b * d.S + t) * d.K + i)];
          if (causal(d, t, s) && s < d.Skv) row[s] = 1;
        }
      }
    }
  return mask;
}

// tau * mq[t, h] . mk[s, h / (H / Hk)]
inline double main_score(const IndexerProblem& p, int64_t b, int64_t t, int64_t h, int64_t s) {
  const auto& td = p.td;
  double dot = 0;
  for (int64_t c = 0; c < td.D; ++c)
    dot += p.mq[size_t(((b * p.d.S + t) * td.H + h) * td.D + c)] *
           p.mk[size_t(((b * p.d.Skv + s) * td.Hk + h / (td.H / td.Hk)) * td.D + c)];
  return td.scale * dot;
}

// Fills p.mlse with each head's lse over V_t: the dense attention's (dense stage) or the sparse
// attention's restricted to the selection (sparse stage), so each head's row sums to 1.
inline void set_main_lse(IndexerProblem& p) {
  const auto mask = valid_mask(p.d, p.idx);
  p.mlse.assign(size_t(p.d.B * p.d.S * p.td.H), std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < p.d.B; ++b)
    for (int64_t t = 0; t < p.d.S; ++t)
      for (int64_t h = 0; h < p.td.H; ++h) {
        double z = 0;
        for (int64_t s = 0; s < p.d.Skv; ++s)
          if (mask[size_t((b * p.d.S + t) * p.d.Skv + s)]) z += std::exp(main_score(p, b, t, h, s));
        if (z > 0) p.mlse[size_t((b * p.d.S + t) * p.td.H + h)] = std::log(z);
      }
}

// The sparse-stage target per slot of p.idx, [B, S, K]: the head mean of the main attention's
// probabilities exp(score - mlse) at the slot's key, 0 for invalid slots (what sparse attention's
// head_mean gives; the input of indexer_kl_loss_sparse).
inline Doubles slot_target(const IndexerProblem& p) {
  const auto& d = p.d;
  Doubles out(size_t(d.B * d.S * d.K), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.S; ++t)
      for (int64_t i = 0; i < d.K; ++i) {
        const int64_t r = b * d.S + t;
        const int32_t s = p.idx[size_t(r * d.K + i)];
        if (!causal(d, t, s) || s >= d.Skv) continue;
        double sum = 0;
        for (int64_t h = 0; h < p.td.H; ++h)
          sum += std::exp(main_score(p, b, t, h, s) - p.mlse[size_t(r * p.td.H + h)]);
        out[size_t(r * d.K + i)] = sum / double(p.td.H);
      }
  return out;
}

// sum over rows of KL(p_t || softmax over V_t of I_t), with the full matrices in memory.
inline double naive_kl_loss(const IndexerProblem& p) {
  const auto& d = p.d;
  const Doubles scores = naive_scores(d, p.q, p.k, p.w);
  const auto mask = valid_mask(d, p.idx);
  double loss = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.S; ++t) {
      const size_t row = size_t((b * d.S + t) * d.Skv);
      double z = 0;
      for (int64_t s = 0; s < d.Skv; ++s)
        if (mask[row + size_t(s)]) z += std::exp(scores[row + size_t(s)]);
      for (int64_t s = 0; s < d.Skv; ++s) {
        if (!mask[row + size_t(s)]) continue;
        double target = 0;
        for (int64_t h = 0; h < p.td.H; ++h)
          target += std::exp(main_score(p, b, t, h, s) - p.mlse[size_t((b * d.S + t) * p.td.H + h)]);
        target /= double(p.td.H);
        if (target > 0) loss += target * (std::log(target) - (scores[row + size_t(s)] - std::log(z)));
      }
    }
  return loss;
}

// A random problem: inputs in [-1, 1) (main q in [-2, 2) for a peaked target), w of both signs,
// and in the sparse stage (K > 0) a random selection per row: distinct candidates, plus -1,
// future and out-of-range entries that must be ignored.
inline IndexerProblem random_problem(int64_t B, int64_t S, int64_t Skv, int64_t HI, int64_t DI, int64_t H,
                                     int64_t Hk, int64_t D, int64_t K, const std::string& name) {
  IndexerProblem p;
  p.d.B = B, p.d.S = S, p.d.Skv = Skv, p.d.HI = HI, p.d.DI = DI, p.d.K = K;
  p.td.H = H, p.td.Hk = Hk, p.td.D = D, p.td.scale = 1.0 / std::sqrt(double(D));
  p.q = random_doubles(size_t(B * S * HI * DI), 11, name + ".q");
  p.k = random_doubles(size_t(B * Skv * DI), 11, name + ".k");
  p.w = random_doubles(size_t(B * S * HI), 11, name + ".w");
  p.mq = random_doubles(size_t(B * S * H * D), 11, name + ".mq", -2, 2);
  p.mk = random_doubles(size_t(B * Skv * Hk * D), 11, name + ".mk");
  if (K > 0) {
    p.idx.assign(size_t(B * S * K), -1);
    const Doubles u = random_doubles(size_t(B * S * Skv), 11, name + ".idx");
    for (int64_t r = 0; r < B * S; ++r) {
      const int64_t t = r % S, n = t + Skv - S + 1;
      // A random permutation of the candidates (by sorting random keys); the first K - 1 are
      // taken, and the last slot gets an invalid entry when K > 1.
      std::vector<int32_t> perm(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) perm[size_t(s)] = int32_t(s);
      std::sort(perm.begin(), perm.end(),
                [&](int32_t a, int32_t c) { return u[size_t(r * Skv + a)] < u[size_t(r * Skv + c)]; });
      const int64_t take = std::min(n, K > 1 ? K - 1 : K);
      for (int64_t i = 0; i < take; ++i) p.idx[size_t(r * K + i)] = perm[size_t(i)];
      if (K > 1) {
        const int32_t invalid[3] = {-1, int32_t(t + Skv - S + 1), int32_t(Skv + 3)};
        p.idx[size_t(r * K + K - 1)] = invalid[r % 3];
      }
    }
  }
  set_main_lse(p);
  return p;
}

}  // namespace titan::test
