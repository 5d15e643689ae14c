// MLA: the absorbed (latent MQA) form equals the standard per-head form, with and without the
// query latent, in one call and in chunks through the latent cache; and the column ops the
// standard form is built from have exact gradients.
#include <gtest/gtest.h>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/models/deepseek_v3/mla.h"

using namespace titan;
using namespace titan::models::deepseek_v3;

namespace {

DeepSeekV3Args tiny_args(int64_t q_lora_rank) {
  DeepSeekV3Args a;
  a.dim = 32, a.n_heads = 4, a.n_layers = 1, a.n_dense_layers = 1, a.q_lora_rank = q_lora_rank;
  a.kv_lora_rank = 16, a.qk_nope_head_dim = 8, a.qk_rope_head_dim = 4, a.v_head_dim = 6;
  a.max_seq_len = 64, a.original_seq_len = 16, a.rope_factor = 4, a.mscale = 0.8;  // YaRN on
  return a;
}

// Weights large enough that attention is far from uniform.
void randomize(nn::Module& m, uint64_t seed) {
  for (auto& [name, p] : m.named_parameters()) {
    const bool norm = name.find("norm") != std::string::npos;
    p->var.mutable_value().copy_(test::random_tensor(p->var.shape(), DType::f32, seed, name, norm ? 0.5 : -0.5, norm ? 1.5 : 0.5));
  }
}

Tensor positions(int64_t b, int64_t s, int64_t start) {
  Tensor p = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < b * s; ++i) p.data<int32_t>()[i] = int32_t(start + i % s);
  return p;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const auto e = test::compare(test::to_doubles(got), test::to_doubles(want), tol, tol);
  EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1) << what << ": max_abs " << e.max_abs << " at " << e.worst;
}

void check_forms_agree(int64_t q_lora_rank) {
  const DeepSeekV3Args a = tiny_args(q_lora_rank);
  Attention attn(a, 0);
  randomize(attn, 7 + uint64_t(q_lora_rank));
  EXPECT_EQ(attn.wq != nullptr, q_lora_rank == 0);
  const kernels::RopeTables rope = kernels::rope_tables(a.rope(), a.max_seq_len);
  const int64_t b = 2, s = 11;
  const Tensor x = test::random_tensor({b, s, a.dim}, DType::f32, 3, "x");
  Tensor standard;
  {
    autograd::NoGradGuard no_grad;
    standard = attn.forward(autograd::Variable(x), rope, positions(b, s, 0)).value();  // [B, S, D]
  }
  LatentCache cache = LatentCache::allocate(a, b, s);
  expect_close(attn.forward_absorbed(x, rope, positions(b, s, 0), cache, 0), standard, 2e-5, "absorbed, one call");

  // In two chunks: the second attends to the first through the cache.
  LatentCache chunked = LatentCache::allocate(a, b, s);
  const int64_t split = 4;
  const Tensor first = attn.forward_absorbed(x.slice(1, 0, split).contiguous(), rope, positions(b, split, 0), chunked, 0);
  const Tensor second =
      attn.forward_absorbed(x.slice(1, split, s).contiguous(), rope, positions(b, s - split, split), chunked, split);
  expect_close(first, standard.slice(1, 0, split).contiguous(), 2e-5, "absorbed, first chunk");
  expect_close(second, standard.slice(1, split, s).contiguous(), 2e-5, "absorbed, second chunk");
}

}  // namespace

TEST(Mla, AbsorbedFormMatchesStandardWithQueryLatent) { check_forms_agree(12); }

TEST(Mla, AbsorbedFormMatchesStandardWithPlainQuery) { check_forms_agree(0); }

TEST(Mla, SoftmaxScaleFollowsDeepSeek) {
  // docs/dsa.md 1.2: 671B's tau = 192^-0.5 * (1 + 0.1 ln 40)^2.
  const DeepSeekV3Args a = deepseek_v3_flavor("671B");
  EXPECT_NEAR(a.softmax_scale(), 0.1352338, 1e-6);
  DeepSeekV3Args short_context = a;
  short_context.max_seq_len = a.original_seq_len;  // no YaRN: plain d_qk^-0.5
  EXPECT_NEAR(short_context.softmax_scale(), 1.0 / std::sqrt(192.0), 1e-12);
  EXPECT_EQ(short_context.rope().scaling, kernels::RopeScaling::none);
  EXPECT_EQ(a.rope().scaling, kernels::RopeScaling::yarn);
  EXPECT_DOUBLE_EQ(kernels::rope_table_magnitude(a.rope()), 1.0);  // tables unscaled, as DeepSeek
}

// The fused key/value split is the narrow_last + concat_last composition it replaces, values and
// gradients bit for bit, also when only the keys (or only the values) receive a gradient.
TEST(Mla, KeysValuesSplitMatchesNarrowAndConcat) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int used : {3, 1, 2}) {  // bit 0: the keys feed the loss, bit 1: the values do
      SCOPED_TRACE(std::string(dt == DType::f32 ? "f32" : "bf16") + " used " + std::to_string(used));
      const Tensor kvv = test::random_tensor({2, 3, 4, 7}, DType::f32, 3, "kv");  // Dn 5, Dv 2
      const Tensor rv = test::random_tensor({2, 3, 1, 3}, DType::f32, 4, "k_rope");
      const Tensor dk = test::random_tensor({2, 3, 4, 8}, DType::f32, 5, "dk");
      const Tensor dv = test::random_tensor({2, 3, 4, 2}, DType::f32, 6, "dv");
      // sum(k * dk) + sum(v * dv) over the outputs the case uses (in f32, which the small ops take):
      // their gradients are dk and dv, rounded to the dtype.
      // Each path runs forward and backward on its own (backward consumes the whole tape).
      auto run_backward = [&](const autograd::Variable& k, const autograd::Variable& v) {
        autograd::Variable l;
        if (used & 1) l = autograd::sum(autograd::mul(autograd::cast(k, DType::f32), autograd::Variable(dk, false)));
        if (used & 2) {
          autograd::Variable lv =
              autograd::sum(autograd::mul(autograd::cast(v, DType::f32), autograd::Variable(dv, false)));
          l = l.defined() ? autograd::add(l, lv) : lv;
        }
        autograd::backward(l);
      };
      // f32 leaves cast to the dtype: in the model kv and k_rope are activations, whose gradients
      // have their dtype (a leaf's is f32).
      autograd::Variable kv1(kvv, true), r1(rv, true), kv2(kvv, true), r2(rv, true);
      const auto [k1, v1] = autograd::mla_keys_values(autograd::cast(kv1, dt), autograd::cast(r1, dt), 5);
      run_backward(k1, v1);
      const autograd::Variable kv2c = autograd::cast(kv2, dt);
      const autograd::Variable k2 = autograd::concat_last(autograd::narrow_last(kv2c, 0, 5), autograd::cast(r2, dt));
      const autograd::Variable v2 = autograd::narrow_last(kv2c, 5, 2);
      run_backward(k2, v2);
      EXPECT_EQ(test::to_doubles(k1.value()), test::to_doubles(k2.value()));
      EXPECT_EQ(test::to_doubles(v1.value()), test::to_doubles(v2.value()));
      EXPECT_EQ(test::to_doubles(kv1.grad()), test::to_doubles(kv2.grad()));
      if (used & 1) {
        EXPECT_EQ(test::to_doubles(r1.grad()), test::to_doubles(r2.grad()));
      }
    }
  }
}

TEST(Mla, ConcatAndNarrowGradientsAreExact) {
  const Tensor av = test::random_tensor({2, 3, 4, 5}, DType::f32, 1, "a");
  const Tensor bv = test::random_tensor({2, 3, 1, 2}, DType::f32, 1, "b");
  autograd::Variable a(av, true), b(bv, true);
  autograd::Variable y = autograd::concat_last(a, b);  // [2, 3, 4, 7]
  ASSERT_EQ(y.shape(), Shape({2, 3, 4, 7}));
  autograd::Variable z = autograd::narrow_last(y, 3, 3);  // columns 3, 4 of a and 0 of b
  const Tensor dz = test::random_tensor(z.shape(), DType::f32, 2, "dz");
  autograd::backward(z, dz);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      double db0 = 0;
      for (int64_t h = 0; h < 4; ++h) {
        EXPECT_EQ(y.value().at({i, j, h, 5}), bv.at({i, j, 0, 0}));
        for (int64_t d = 0; d < 5; ++d) EXPECT_EQ(a.grad().at({i, j, h, d}), d >= 3 ? dz.at({i, j, h, d - 3}) : 0.0);
        db0 += dz.at({i, j, h, 2});
      }
      EXPECT_NEAR(b.grad().at({i, j, 0, 0}), db0, 1e-6);  // the broadcast's gradient sums over heads
      EXPECT_EQ(b.grad().at({i, j, 0, 1}), 0.0);
    }
}

// mla_attention (keys and values read inside kv and k_rope) against attention over
// mla_keys_values' assembled keys and values: output and the gradients of q, kv and k_rope, in f32
// (the in-place kernels) and bf16 (assembled, AMX where the CPU has it), with the gradients stored
// into fresh buffers and, when kv also feeds the loss directly, added to the one it already has.
TEST(Mla, FusedAttentionMatchesKeysValuesThenAttention) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool kv_in_loss : {false, true}) {
      SCOPED_TRACE(std::string(dt == DType::f32 ? "f32" : "bf16") + (kv_in_loss ? " kv in loss" : ""));
      // B 2, S 70 (a 64-row block and a short one), H 3, Dn 32, Dr 16, Dv 32.
      const Tensor qv = test::random_tensor({2, 70, 3, 48}, DType::f32, 1, "q", -2, 2);
      const Tensor kvv = test::random_tensor({2, 70, 3, 64}, DType::f32, 2, "kv", -2, 2);
      const Tensor rv = test::random_tensor({2, 70, 1, 16}, DType::f32, 3, "k_rope", -2, 2);
      const Tensor dov = test::random_tensor({2, 70, 3, 32}, DType::f32, 4, "dout");
      const Tensor wkv = test::random_tensor({2, 70, 3, 64}, DType::f32, 5, "wkv");
      const double scale = 0.3;
      // Each path runs forward and backward on its own (backward consumes the whole tape).
      auto run = [&](bool fused, autograd::Variable& q, autograd::Variable& kv, autograd::Variable& r) {
        const autograd::Variable qc = autograd::cast(q, dt), kvc = autograd::cast(kv, dt), rc = autograd::cast(r, dt);
        autograd::Variable o;
        if (fused) {
          o = autograd::mla_attention(qc, kvc, rc, 32, scale);
        } else {
          const auto [k, v] = autograd::mla_keys_values(kvc, rc, 32);
          o = autograd::attention(qc, k, v, scale);
        }
        autograd::Variable l = autograd::sum(autograd::mul(autograd::cast(o, DType::f32), autograd::Variable(dov, false)));
        if (kv_in_loss) {
          l = autograd::add(l, autograd::sum(autograd::mul(autograd::cast(kvc, DType::f32), autograd::Variable(wkv, false))));
        }
        const Tensor out = o.value();
        autograd::backward(l);
        return out;
      };
      autograd::Variable q1(qv, true), kv1(kvv, true), r1(rv, true), q2(qv, true), kv2(kvv, true), r2(rv, true);
      const Tensor o1 = run(true, q1, kv1, r1), o2 = run(false, q2, kv2, r2);
      const double tol = dt == DType::f32 ? 1e-5 : 2e-2;
      auto expect_close = [tol](const Tensor& got, const Tensor& want, const char* name) {
        const test::ErrorStats e = test::compare(test::to_doubles(got), test::to_doubles(want), tol, tol);
        EXPECT_LE(e.max_scaled, 1.0) << name << " worst element " << e.worst;
        EXPECT_EQ(e.nonfinite, 0) << name;
      };
      expect_close(o1, o2, "o");
      expect_close(q1.grad(), q2.grad(), "dq");
      expect_close(kv1.grad(), kv2.grad(), "dkv");
      expect_close(r1.grad(), r2.grad(), "dk_rope");
    }
  }
}
