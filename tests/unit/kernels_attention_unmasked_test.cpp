// Ring attention's kernel pieces: unmasked attention (fast tiles vs the reference twin, on
// awkward shapes) and the log-sum-exp merge, checked by rebuilding causal attention from blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "common/backend_compare.h"
#include "common/kernel_check.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/attention_unmasked.h"

using namespace titan;
using namespace titan::test;

namespace {

struct Shapes {
  int64_t B, Sq, Skv, H, Hkv, Dqk, Dv;
};

void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  const ErrorStats e = compare(to_doubles(got), to_doubles(want), atol, rtol);
  EXPECT_LE(e.max_scaled, 1.0) << what << ": max abs error " << e.max_abs << " at " << e.worst;
}

// grad_dt: the gradients' dtype (dt, or f32 under bf16).
void check_fast_vs_reference(const Shapes& s, DType dt, DType grad_dt) {
  const std::string name = "B" + std::to_string(s.B) + " Sq" + std::to_string(s.Sq) + " Skv" + std::to_string(s.Skv) +
                           " H" + std::to_string(s.H) + "/" + std::to_string(s.Hkv) + " " + std::string(dtype_name(dt)) +
                           " grads " + std::string(dtype_name(grad_dt));
  const Tensor q = random_tensor({s.B, s.Sq, s.H, s.Dqk}, dt, 5, name + "q", -2, 2);
  const Tensor k = random_tensor({s.B, s.Skv, s.Hkv, s.Dqk}, dt, 5, name + "k", -2, 2);
  const Tensor v = random_tensor({s.B, s.Skv, s.Hkv, s.Dv}, dt, 5, name + "v");
  const Tensor dout = random_tensor({s.B, s.Sq, s.H, s.Dv}, dt, 5, name + "do");
  const double scale = 0.37;
  const OpOutputs out = fast_vs_reference({"o", "lse", "dq", "dk", "dv"}, [&] {
    Tensor o = Tensor::empty({s.B, s.Sq, s.H, s.Dv}, dt), lse = Tensor::empty({s.B, s.H, s.Sq}, DType::f32);
    kernels::attention_unmasked_forward(o, lse, q, k, v, scale);
    // Gradients start from nonzero values: the backward adds to them.
    Tensor dq = random_tensor(q.shape(), grad_dt, 6, name + "dq"), dk = random_tensor(k.shape(), grad_dt, 6, name + "dk");
    Tensor dv = random_tensor(v.shape(), grad_dt, 6, name + "dv");
    kernels::attention_unmasked_backward(dq, dk, dv, lse, dout, q, k, v, o, scale);
    return std::vector<Tensor>{o, lse, dq, dk, dv};
  });
  const bool f32 = dt == DType::f32;
  for (const OpOutput& x : out) {
    ASSERT_EQ(x.name == "o" || x.name == "lse" ? x.ref.dtype() : grad_dt, x.fast.dtype()) << name << " " << x.name;
    expect_close(x.fast, x.ref, f32 ? 2e-5 : 3e-2, f32 ? 2e-4 : 3e-2, name + " " + x.name);
  }
}

}  // namespace

TEST(AttentionUnmasked, FastMatchesReferenceOnAwkwardShapes) {
  for (auto [dt, grad_dt] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
                              std::pair{DType::bf16, DType::f32}}) {
    check_fast_vs_reference({1, 1, 1, 1, 1, 3, 2}, dt, grad_dt);
    check_fast_vs_reference({2, 70, 300, 4, 2, 24, 16}, dt, grad_dt);  // partial query and key tiles, GQA
    check_fast_vs_reference({1, 129, 17, 3, 1, 40, 24}, dt, grad_dt);  // MQA, Dqk != Dv
    check_fast_vs_reference({2, 5, 513, 2, 2, 16, 32}, dt, grad_dt);   // keys over two full tiles and a tail
  }
}

// Causal attention over [A | B] rebuilt from blocks for B's queries: the causal kernel on B alone,
// merged with unmasked attention of B over A. The backward of each block from the merged o and
// lse must add up to the whole causal backward.
TEST(AttentionUnmasked, BlocksMergeIntoCausalAttention) {
  const int64_t batch = 2, na = 37, nb = 29, s = na + nb, h = 4, hkv = 2, dqk = 12, dv = 8;
  const Tensor q = random_tensor({batch, s, h, dqk}, DType::f32, 9, "q", -2, 2);
  const Tensor k = random_tensor({batch, s, hkv, dqk}, DType::f32, 9, "k", -2, 2);
  const Tensor v = random_tensor({batch, s, hkv, dv}, DType::f32, 9, "v");
  Tensor o = Tensor::empty({batch, s, h, dv}, DType::f32), lse = Tensor::empty({batch, h, s}, DType::f32);
  kernels::attention_forward(o, lse, q, k, v);
  const double scale = kernels::default_attention_scale(dqk);
  auto rows = [](const Tensor& x, int64_t from, int64_t n) { return x.slice(1, from, from + n).contiguous(); };
  const Tensor qb = rows(q, na, nb), ka = rows(k, 0, na), va = rows(v, 0, na), kb = rows(k, na, nb), vb = rows(v, na, nb);

  Tensor ob = Tensor::empty({batch, nb, h, dv}, DType::f32), lse_b = Tensor::empty({batch, h, nb}, DType::f32);
  kernels::attention_forward(ob, lse_b, qb, kb, vb);
  Tensor o_a = Tensor::empty({batch, nb, h, dv}, DType::f32), lse_a = Tensor::empty({batch, h, nb}, DType::f32);
  kernels::attention_unmasked_forward(o_a, lse_a, qb, ka, va, scale);
  kernels::attention_merge(ob, lse_b, o_a, lse_a, 0);
  expect_close(ob, rows(o, na, nb), 1e-6, 1e-5, "merged o");
  expect_close(lse_b, lse.slice(2, na, s).contiguous(), 1e-6, 1e-5, "merged lse");

  // dout only on B's rows: the whole backward's dq rows of B and its dk, dv come from B's queries.
  Tensor dout = Tensor::zeros(o.shape(), DType::f32);
  const Tensor dout_b = random_tensor({batch, nb, h, dv}, DType::f32, 9, "dout");
  dout.slice(1, na, s).copy_(dout_b);
  Tensor dq = Tensor::zeros(q.shape(), DType::f32), dk = Tensor::zeros(k.shape(), DType::f32);
  Tensor dvv = Tensor::zeros(v.shape(), DType::f32);
  kernels::attention_backward(dq, dk, dvv, lse, dout, q, k, v, o);
  Tensor dqb = Tensor::zeros(qb.shape(), DType::f32), dkb = Tensor::zeros(kb.shape(), DType::f32);
  Tensor dvb = Tensor::zeros(vb.shape(), DType::f32), dka = Tensor::zeros(ka.shape(), DType::f32);
  Tensor dva = Tensor::zeros(va.shape(), DType::f32);
  kernels::attention_backward(dqb, dkb, dvb, lse_b, dout_b, qb, kb, vb, ob);
  kernels::attention_unmasked_backward(dqb, dka, dva, lse_b, dout_b, qb, ka, va, ob, scale);
  expect_close(dqb, rows(dq, na, nb), 1e-5, 1e-4, "dq of B");
  expect_close(dkb, rows(dk, na, nb), 1e-5, 1e-4, "dk of B");
  expect_close(dvb, rows(dvv, na, nb), 1e-5, 1e-4, "dv of B");
  expect_close(dka, rows(dk, 0, na), 1e-5, 1e-4, "dk of A");
  expect_close(dva, rows(dvv, 0, na), 1e-5, 1e-4, "dv of A");
}

// The merge at an offset into a longer running result, with a bf16 part: rows outside
// [row0, row0 + Lp) keep their values; a running row with no keys yet (lse = -inf) takes the part.
TEST(AttentionUnmasked, MergeAtAnOffsetLeavesOtherRows) {
  const int64_t b = 2, l = 11, lp = 4, row0 = 5, h = 3, dv = 6;
  Tensor o = random_tensor({b, l, h, dv}, DType::f32, 4, "o"), lse = random_tensor({b, h, l}, DType::f32, 4, "lse");
  for (int64_t bi = 0; bi < b; ++bi) lse.data<float>()[(bi * h + 1) * l + row0 + 2] = -INFINITY;  // head 1, part row 2
  const Tensor o_part = random_tensor({b, lp, h, dv}, DType::bf16, 4, "op"), lse_part = random_tensor({b, h, lp}, DType::f32, 4, "lp");
  const Tensor o0 = o.clone(), lse0 = lse.clone();
  kernels::attention_merge(o, lse, o_part, lse_part, row0);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < l; ++i) {
        const float a = lse0.data<float>()[(bi * h + hi) * l + i];
        const bool part = i >= row0 && i < row0 + lp;
        const float c = part ? lse_part.data<float>()[(bi * h + hi) * lp + i - row0] : 0;
        const double merged = part ? std::log(std::exp(double(a)) + std::exp(double(c))) : a;
        EXPECT_NEAR(lse.data<float>()[(bi * h + hi) * l + i], merged, 1e-5) << bi << " " << hi << " " << i;
        for (int64_t col = 0; col < dv; ++col) {
          const int64_t at = ((bi * l + i) * h + hi) * dv + col;
          double want = o0.data<float>()[at];
          if (part) {
            const double pv = bf16_to_f32(o_part.data<bf16>()[((bi * lp + i - row0) * h + hi) * dv + col]);
            want = std::exp(double(a) - merged) * want + std::exp(double(c) - merged) * pv;
          }
          EXPECT_NEAR(o.data<float>()[at], want, 1e-5) << bi << " " << hi << " " << i << " " << col;
        }
      }
}

TEST(AttentionUnmasked, RejectsBadArguments) {
  const Tensor q = random_tensor({1, 4, 3, 8}, DType::f32, 1, "q"), k = random_tensor({1, 6, 2, 8}, DType::f32, 1, "k");
  const Tensor v = random_tensor({1, 6, 2, 8}, DType::f32, 1, "v");
  Tensor o = Tensor::empty({1, 4, 3, 8}, DType::f32), lse = Tensor::empty({1, 3, 4}, DType::f32);
  EXPECT_THROW(kernels::attention_unmasked_forward(o, lse, q, k, v, 0.5), Error);  // 3 heads, 2 kv heads
  const Tensor q4 = random_tensor({1, 4, 4, 8}, DType::f32, 1, "q4");
  Tensor o4 = Tensor::empty({1, 4, 4, 8}, DType::f32), bad_lse = Tensor::empty({1, 4, 5}, DType::f32);
  EXPECT_THROW(kernels::attention_unmasked_forward(o4, bad_lse, q4, k, v, 0.5), Error);
  Tensor running = Tensor::zeros({1, 4, 4, 8}, DType::f32), running_lse = Tensor::zeros({1, 4, 4}, DType::f32);
  Tensor lse4 = Tensor::empty({1, 4, 4}, DType::f32);
  kernels::attention_unmasked_forward(o4, lse4, q4, k, v, 0.5);
  EXPECT_THROW(kernels::attention_merge(running, running_lse, o4, lse4, 1), Error);  // rows 1..5 of 4
}
