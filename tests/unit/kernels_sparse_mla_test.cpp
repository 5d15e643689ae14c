// Sparse MLA attention (absorbed MQA form): the reference against the dense masked formula in
// double, and the Tensor API (under both kernel backends) on the semantics docs/dsa.md section 7 asks
// for: invalid slots ignored, empty rows, never-selected keys, slot order, and equality with
// causal dense MQA attention when every causal key is selected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gradcheck.h"
#include "common/kernel_check.h"
#include "common/sparse_mla_inputs.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/sparse_mla.h"
#include "titan/kernels/sparse_mla.h"

using namespace titan;
using namespace titan::test;
using kernels::SparseMlaParams;

namespace {

SparseMlaParams dims(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Dqk, int64_t Dv, int64_t K, double scale) {
  SparseMlaParams d;
  d.B = B, d.S = S, d.Skv = Skv, d.H = H, d.Dqk = Dqk, d.Dv = Dv, d.K = K, d.scale = scale;
  return d;
}

// The formula written densely: a boolean mask [S, Skv] from the valid slots of idx, dense scores
// scale * q . kv for every key, -inf where the mask is false, softmax, times kv[:, :Dv].
void dense_masked(Doubles& o, Doubles& lse, const Doubles& q, const Doubles& kv, const int32_t* idx,
                  const SparseMlaParams& d) {
  o.assign(size_t(d.B * d.S * d.H * d.Dv), 0.0);
  lse.assign(size_t(d.B * d.S * d.H), 0.0);
  std::vector<char> mask(size_t(d.S * d.Skv));
  std::vector<double> scores(size_t(d.Skv));
  for (int64_t b = 0; b < d.B; ++b) {
    std::fill(mask.begin(), mask.end(), 0);
    for (int64_t t = 0; t < d.S; ++t) {
      for (int64_t i = 0; i < d.K; ++i) {
        const int32_t s = idx[(b * d.S + t) * d.K + i];
        if (s >= 0 && s < d.Skv && s <= t + d.Skv - d.S) mask[size_t(t * d.Skv + s)] = 1;
      }
    }
    for (int64_t t = 0; t < d.S; ++t) {
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        double z = 0;
        for (int64_t s = 0; s < d.Skv; ++s) {
          double dot = 0;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            dot += q[size_t(row * d.Dqk + c)] * kv[size_t((b * d.Skv + s) * d.Dqk + c)];
          }
          scores[size_t(s)] = mask[size_t(t * d.Skv + s)] ? d.scale * dot : -INFINITY;
          z += std::exp(scores[size_t(s)]);
        }
        lse[size_t(row)] = z > 0 ? std::log(z) : INFINITY;
        if (z == 0) continue;
        for (int64_t s = 0; s < d.Skv; ++s) {
          const double p = std::exp(scores[size_t(s)]) / z;
          for (int64_t c = 0; c < d.Dv; ++c) o[size_t(row * d.Dv + c)] += p * kv[size_t((b * d.Skv + s) * d.Dqk + c)];
        }
      }
    }
  }
}

TEST(SparseMlaReference, MatchesDenseMaskedSoftmaxInDouble) {
  struct Case {
    SparseMlaParams d;
    SparseIdxOptions opt;
  };
  const std::vector<Case> cases = {
      {dims(1, 1, 1, 1, 3, 2, 1, 0.5), {}},                    // one query, one key
      {dims(2, 6, 6, 3, 5, 4, 8, 0.7), {}},                    // K > valid keys: -1 / >= Skv padding
      {dims(1, 7, 11, 2, 9, 9, 5, 0.4), {false, 0.2}},         // Skv > S, future keys, -1 slots
      {dims(2, 9, 9, 4, 40, 32, 4, 0.2), {false, 0.1}},        // the small-dims split
  };
  for (const Case& c : cases) {
    const SparseMlaParams& d = c.d;
    const Doubles q = random_doubles(size_t(d.B * d.S * d.H * d.Dqk), 5, "q", -2, 2);
    const Doubles kv = random_doubles(size_t(d.B * d.Skv * d.Dqk), 5, "kv", -2, 2);
    const Tensor idx = random_sparse_idx(d.B, d.S, d.Skv, d.K, 5, "idx", c.opt);
    Doubles o_want, lse_want;
    dense_masked(o_want, lse_want, q, kv, idx.data<int32_t>(), d);
    Doubles o(o_want.size()), lse(lse_want.size());
    kernels::ref::sparse_mla_forward<double>(o.data(), lse.data(), nullptr, q.data(), kv.data(),
                                             idx.data<int32_t>(), d);
    for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], o_want[i], 1e-12) << "o[" << i << "]";
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(lse_want[i])) {
        EXPECT_EQ(lse[i], lse_want[i]) << "lse[" << i << "]";
      } else {
        EXPECT_NEAR(lse[i], lse_want[i], 1e-12) << "lse[" << i << "]";
      }
    }
  }
}

// ---- the Tensor API under both backends -----------------------------------------------------

struct Result {
  Tensor o, lse, dq, dkv;
};

// Forward, then backward with dout, through the Tensor API under the current backend.
Result run_api(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& dout, double scale) {
  Result r;
  const DType dt = q.dtype();
  r.o = Tensor::empty({q.size(0), q.size(1), q.size(2), dout.size(3)}, dt);
  r.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::f32);
  kernels::sparse_mla_forward(r.o, r.lse, q, kv, idx, dout.size(3), scale);
  // Garbage in the gradients: the backward overwrites them.
  r.dq = Tensor::full(q.shape(), 7.0, dt);
  r.dkv = Tensor::full(kv.shape(), 7.0, dt);
  kernels::sparse_mla_backward(r.dq, r.dkv, dout, q, kv, idx, r.o, r.lse, scale);
  return r;
}

// Runs f under the fast and the reference backend.
template <class F>
void for_each_backend(F&& f) {
  const kernels::KernelBackend saved = kernels::kernel_backend();
  for (kernels::KernelBackend b : {kernels::KernelBackend::fast, kernels::KernelBackend::reference}) {
    kernels::set_kernel_backend(b);
    f(b == kernels::KernelBackend::fast ? "fast" : "reference");
  }
  kernels::set_kernel_backend(saved);
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const ErrorStats e = compare(to_doubles(got), to_doubles(want), tol, tol);
  EXPECT_LE(e.max_scaled, 1.0) << what << ": max |diff| " << e.max_abs << " at " << e.worst;
  EXPECT_EQ(e.nonfinite, 0) << what;
}

struct Problem {
  SparseMlaParams d;
  Tensor q, kv, dout;
  Problem(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Dqk, int64_t Dv, int64_t K, double scale,
          DType dt = DType::f32)
      : d(dims(B, S, Skv, H, Dqk, Dv, K, scale)),
        q(random_tensor({B, S, H, Dqk}, dt, 9, "q", -2, 2)),
        kv(random_tensor({B, Skv, Dqk}, dt, 9, "kv", -2, 2)),
        dout(random_tensor({B, S, H, Dv}, dt, 9, "dout")) {}
  Result run(const Tensor& idx) const { return run_api(q, kv, idx, dout, d.scale); }
};

TEST(SparseMlaApi, RejectsBadArguments) {
  const Problem p(1, 4, 4, 2, 8, 6, 3, 0.5);
  const Tensor idx = random_sparse_idx(1, 4, 4, 3, 1, "idx");
  Tensor o = Tensor::empty({1, 4, 2, 6}, DType::f32), lse = Tensor::empty({1, 4, 2}, DType::f32);
  EXPECT_NO_THROW(kernels::sparse_mla_forward(o, lse, p.q, p.kv, idx, 6, 0.5));
  EXPECT_THROW(kernels::sparse_mla_forward(o, lse, p.q, p.kv, idx, 9, 0.5), Error);  // dv > Dqk
  Tensor lse_bhs = Tensor::empty({1, 2, 4}, DType::f32);                             // [B, H, S]: wrong
  EXPECT_THROW(kernels::sparse_mla_forward(o, lse_bhs, p.q, p.kv, idx, 6, 0.5), Error);
  const Tensor idx_i64 = Tensor::zeros({1, 4, 3}, DType::i64);
  EXPECT_THROW(kernels::sparse_mla_forward(o, lse, p.q, p.kv, idx_i64, 6, 0.5), Error);
  const Tensor kv_bf16 = p.kv.to(DType::bf16);
  EXPECT_THROW(kernels::sparse_mla_forward(o, lse, p.q, kv_bf16, idx, 6, 0.5), Error);
  const Tensor kv_short = random_tensor({1, 3, 8}, DType::f32, 1, "kv");  // Skv < S
  EXPECT_THROW(kernels::sparse_mla_forward(o, lse, p.q, kv_short, idx, 6, 0.5), Error);
}

// Against the double reference on the same (f32) values, including the gradients.
TEST(SparseMlaApi, MatchesDoubleReference) {
  const Problem p(2, 13, 17, 3, 40, 32, 6, 0.5);
  const Tensor idx = random_sparse_idx(2, 13, 17, 6, 2, "idx", {false, 0.1});
  const Doubles q = to_doubles(p.q), kv = to_doubles(p.kv), dout = to_doubles(p.dout);
  const SparseMlaParams& d = p.d;
  Doubles o(size_t(d.B * d.S * d.H * d.Dv)), lse(size_t(d.B * d.S * d.H)), dq(q.size()), dkv(kv.size());
  kernels::ref::sparse_mla_forward<double>(o.data(), lse.data(), nullptr, q.data(), kv.data(),
                                           idx.data<int32_t>(), d);
  kernels::ref::sparse_mla_backward<double>(dq.data(), dkv.data(), dout.data(), q.data(), kv.data(),
                                            idx.data<int32_t>(), o.data(), lse.data(), d);
  for_each_backend([&](const char* backend) {
    const Result r = p.run(idx);
    const std::string tag = backend;
    EXPECT_LE(compare(to_doubles(r.o), o, 1e-6, 1e-5).max_scaled, 1.0) << tag << " o";
    EXPECT_LE(compare(to_doubles(r.lse), lse, 1e-6, 1e-5).max_scaled, 1.0) << tag << " lse";
    EXPECT_LE(compare(to_doubles(r.dq), dq, 1e-5, 1e-4).max_scaled, 1.0) << tag << " dq";
    EXPECT_LE(compare(to_doubles(r.dkv), dkv, 1e-5, 1e-4).max_scaled, 1.0) << tag << " dkv";
  });
}

// Rewriting invalid slots (future keys, >= Skv) as -1 changes nothing, and neither does
// permuting the slots of each row (up to rounding).
TEST(SparseMlaApi, InvalidSlotsIgnoredAndSlotOrderIrrelevant) {
  const Problem p(1, 12, 15, 5, 24, 16, 9, 0.5);
  const Tensor idx = random_sparse_idx(1, 12, 15, 9, 3, "idx", {false, 0.15});
  Tensor cleaned = idx.clone(), permuted = idx.clone();
  int32_t* c = cleaned.data<int32_t>();
  for (int64_t t = 0; t < p.d.S; ++t) {
    for (int64_t i = 0; i < p.d.K; ++i) {
      int32_t& s = c[t * p.d.K + i];
      if (!kernels::ref::sparse_mla_slot_valid(s, t, p.d)) s = -1;
    }
    int32_t* row = permuted.data<int32_t>() + t * p.d.K;
    std::reverse(row, row + p.d.K);
    std::rotate(row, row + t % p.d.K, row + p.d.K);
  }
  for_each_backend([&](const char* backend) {
    const Result a = p.run(idx), b = p.run(cleaned), r = p.run(permuted);
    const std::string tag = backend;
    for (const auto& [x, name] : {std::pair{&b, "cleaned"}, std::pair{&r, "permuted"}}) {
      expect_close(x->o, a.o, 1e-6, tag + " " + name + " o");
      expect_close(x->lse, a.lse, 1e-6, tag + " " + name + " lse");
      expect_close(x->dq, a.dq, 1e-5, tag + " " + name + " dq");
      expect_close(x->dkv, a.dkv, 1e-5, tag + " " + name + " dkv");
    }
  });
}

// Rows with no valid slot give o = 0, lse = +inf and no gradient; a key nobody selects gets a
// gradient of exactly 0, and a key every query selects collects all their contributions. In f32
// and bf16 (the fast backend runs different kernels for each).
TEST(SparseMlaApi, EmptyRowsAndUnselectedKeys) {
  Tensor idx = random_sparse_idx(1, 8, 8, 4, 4, "idx");
  int32_t* x = idx.data<int32_t>();
  for (int64_t t = 0; t < 8; ++t) {
    for (int64_t i = 0; i < 4; ++i) {
      if (x[t * 4 + i] == 5) x[t * 4 + i] = -1;  // key 5: nobody
    }
    if (std::find(x + t * 4, x + t * 4 + 4, 0) == x + t * 4 + 4) x[t * 4] = 0;  // key 0: everybody, once
  }
  const int64_t empty_rows[] = {2, 6};
  for (int64_t t : empty_rows) {
    for (int64_t i = 0; i < 4; ++i) x[t * 4 + i] = i % 2 ? -1 : int32_t(t + 1 + i);  // padding, future keys
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    const Problem p(1, 8, 8, 3, 20, 12, 4, 0.5, dt);
    for_each_backend([&](const char* backend) {
      const Result r = p.run(idx);
      const std::string tag = std::string(backend) + " " + std::string(dtype_name(dt));
      const std::vector<double> o = to_doubles(r.o), lse = to_doubles(r.lse), dq = to_doubles(r.dq),
                                dkv = to_doubles(r.dkv);
      for (int64_t t : empty_rows) {
        for (int64_t h = 0; h < 3; ++h) {
          EXPECT_EQ(lse[size_t(t * 3 + h)], INFINITY) << tag << " t=" << t;
          for (int64_t c = 0; c < 12; ++c) EXPECT_EQ(o[size_t((t * 3 + h) * 12 + c)], 0.0) << tag;
          for (int64_t c = 0; c < 20; ++c) EXPECT_EQ(dq[size_t((t * 3 + h) * 20 + c)], 0.0) << tag;
        }
      }
      for (int64_t c = 0; c < 20; ++c) EXPECT_EQ(dkv[size_t(5 * 20 + c)], 0.0) << tag << " unselected key 5, dim " << c;
      double key0 = 0;
      for (int64_t c = 0; c < 20; ++c) key0 += std::fabs(dkv[size_t(c)]);
      EXPECT_GT(key0, 0.0) << tag;
    });
  }
}

// With every causal key selected, sparse MLA is causal dense MQA attention with k = kv and
// v = kv[..., :Dv]; the dense dk and dv add into one dkv.
TEST(SparseMlaApi, AllCausalKeysEqualDenseMqaAttention) {
  const int64_t B = 2, S = 11, H = 3, Dqk = 24, Dv = 16, K = 13;
  const Problem p(B, S, S, H, Dqk, Dv, K, 0.5);
  Tensor idx = Tensor::empty({B, S, K}, DType::i32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t i = 0; i < K; ++i) idx.data<int32_t>()[(b * S + t) * K + i] = i <= t ? int32_t(t - i) : -1;
    }
  }
  Tensor k = p.kv.clone().view({B, S, 1, Dqk}), v = Tensor::empty({B, S, 1, Dv}, DType::f32);
  for (int64_t r = 0; r < B * S; ++r) {
    for (int64_t c = 0; c < Dv; ++c) v.data<float>()[r * Dv + c] = p.kv.data<float>()[r * Dqk + c];
  }
  Tensor o = Tensor::empty({B, S, H, Dv}, DType::f32), lse = Tensor::empty({B, H, S}, DType::f32);
  kernels::attention_forward(o, lse, p.q, k, v, p.d.scale);
  Tensor dq = Tensor::zeros(p.q.shape(), DType::f32), dk = Tensor::zeros(k.shape(), DType::f32),
         dv = Tensor::zeros(v.shape(), DType::f32);
  kernels::attention_backward(dq, dk, dv, lse, p.dout, p.q, k, v, o, p.d.scale);
  Tensor dkv = dk.view({B, S, Dqk}).clone(), lse_bsh = Tensor::empty({B, S, H}, DType::f32);
  for (int64_t r = 0; r < B * S; ++r) {
    for (int64_t c = 0; c < Dv; ++c) dkv.data<float>()[r * Dqk + c] += dv.data<float>()[r * Dv + c];
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        lse_bsh.data<float>()[(b * S + t) * H + h] = lse.data<float>()[(b * H + h) * S + t];
      }
    }
  }
  for_each_backend([&](const char* backend) {
    const Result r = p.run(idx);
    const std::string tag = backend;
    expect_close(r.o, o, 1e-5, tag + " o");
    expect_close(r.lse, lse_bsh, 1e-5, tag + " lse");
    expect_close(r.dq, dq, 1e-4, tag + " dq");
    expect_close(r.dkv, dkv, 1e-4, tag + " dkv");
  });
}

}  // namespace
