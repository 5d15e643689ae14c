// Rows of the op table for kernels/attention. dims = {B, S, H, Hkv, Dqk, Dv}: odd sequence
// lengths around the 64-row block (1, 2, 17, 63, 65, 130), head dims that are not multiples of
// the 16-float vector (72) and MLA's 192/128 split, GQA groups of 1, 2, 3 and 4, and S = 300 for
// several groups of the fast kernel's 64-row blocks. bf16 rows whose head dims are both multiples
// of 32 take the AMX path at the avx512_bf16 level on CPUs with AMX; the others (16, 72, 48) do not.
#include "common/op_table.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/cpu/attention.h"
#include "titan/kernels/ref/attention.h"

using namespace titan;
using namespace titan::test;

namespace {

struct AttentionCase {
  kernels::AttentionParams d;
  Tensor q, k, v;

  explicit AttentionCase(const OpInput& in) {
    d.B = in.dims[0], d.S = in.dims[1], d.H = in.dims[2], d.Hkv = in.dims[3], d.Dqk = in.dims[4], d.Dv = in.dims[5];
    d.scale = kernels::default_attention_scale(d.Dqk);
    // Inputs in [-2, 2) give score rows with a spread of several units, so the softmax is far
    // from uniform and the running max changes between key blocks.
    q = random_tensor({d.B, d.S, d.H, d.Dqk}, in.dtype, in.seed, "q", -2, 2);
    k = random_tensor({d.B, d.S, d.Hkv, d.Dqk}, in.dtype, in.seed, "k", -2, 2);
    v = random_tensor({d.B, d.S, d.Hkv, d.Dv}, in.dtype, in.seed, "v");
  }
  Tensor o_like() const { return Tensor::empty({d.B, d.S, d.H, d.Dv}, q.dtype()); }
  Tensor lse_like() const { return Tensor::empty({d.B, d.H, d.S}, DType::f32); }
};

template <class T>
OpOutputs run_forward(const AttentionCase& c) {
  Tensor o_fast = c.o_like(), o_ref = c.o_like(), lse_fast = c.lse_like(), lse_ref = c.lse_like();
  TITAN_CPU_KERNEL(attention_forward<T>)(o_fast.data<T>(), lse_fast.data<float>(), c.q.data<T>(), c.k.data<T>(),
                                         c.v.data<T>(), c.d);
  kernels::ref::attention_forward<T>(o_ref.data<T>(), lse_ref.data<float>(), c.q.data<T>(), c.k.data<T>(),
                                     c.v.data<T>(), c.d);
  return {{"o", o_fast, o_ref}, {"lse", lse_fast, lse_ref}};
}

template <class T>
OpOutputs run_backward(const AttentionCase& c, uint64_t seed) {
  const DType dt = c.q.dtype();
  Tensor o = c.o_like(), lse = c.lse_like();
  kernels::ref::attention_forward<T>(o.data<T>(), lse.data<float>(), c.q.data<T>(), c.k.data<T>(), c.v.data<T>(),
                                     c.d);
  Tensor dout = random_tensor(o.shape(), dt, seed, "dout");
  // Nonzero starting gradients: the kernels must add to them, not overwrite.
  Tensor dq_fast = random_tensor(c.q.shape(), dt, seed, "dq0"), dk_fast = random_tensor(c.k.shape(), dt, seed, "dk0"),
         dv_fast = random_tensor(c.v.shape(), dt, seed, "dv0");
  Tensor dq_ref = dq_fast.clone(), dk_ref = dk_fast.clone(), dv_ref = dv_fast.clone();
  TITAN_CPU_KERNEL(attention_backward<T>)(dq_fast.data<T>(), dk_fast.data<T>(), dv_fast.data<T>(), lse.data<float>(),
                                          dout.data<T>(), c.q.data<T>(), c.k.data<T>(), c.v.data<T>(), o.data<T>(),
                                          c.d);
  kernels::ref::attention_backward<T>(dq_ref.data<T>(), dk_ref.data<T>(), dv_ref.data<T>(), lse.data<float>(),
                                      dout.data<T>(), c.q.data<T>(), c.k.data<T>(), c.v.data<T>(), o.data<T>(), c.d);
  return {{"dq", dq_fast, dq_ref}, {"dk", dk_fast, dk_ref}, {"dv", dv_fast, dv_ref}};
}

// MLA rows: dims = {B, S, H, Dn, Dr, Dv}. The fast kernels read keys [kv nope | k_rope] and values
// inside kv [B, S, H, Dn + Dv] and k_rope [B, S, 1, Dr]; the reference runs plain attention on the
// assembled keys and values.
struct MlaCase {
  kernels::AttentionParams d;
  int64_t dn, dr;
  Tensor q, kv, k_rope, k, v;  // k, v: assembled for the reference

  explicit MlaCase(const OpInput& in) : dn(in.dims[3]), dr(in.dims[4]) {
    d.B = in.dims[0], d.S = in.dims[1], d.H = d.Hkv = in.dims[2], d.Dqk = dn + dr, d.Dv = in.dims[5];
    d.scale = kernels::default_attention_scale(d.Dqk);
    q = random_tensor({d.B, d.S, d.H, d.Dqk}, in.dtype, in.seed, "q", -2, 2);
    kv = random_tensor({d.B, d.S, d.H, dn + d.Dv}, in.dtype, in.seed, "kv", -2, 2);
    k_rope = random_tensor({d.B, d.S, 1, dr}, in.dtype, in.seed, "k_rope", -2, 2);
    k = Tensor::empty({d.B, d.S, d.H, d.Dqk}, in.dtype), v = Tensor::empty({d.B, d.S, d.H, d.Dv}, in.dtype);
    kernels::copy_columns(k, 0, kv, 0, dn);
    kernels::copy_columns(k, dn, k_rope, 0, dr, d.H);
    kernels::copy_columns(v, 0, kv, dn, d.Dv);
  }
  Tensor o_like() const { return Tensor::empty({d.B, d.S, d.H, d.Dv}, DType::f32); }
  Tensor lse_like() const { return Tensor::empty({d.B, d.H, d.S}, DType::f32); }
};

OpOutputs run_mla_forward(const MlaCase& c) {
  Tensor o_fast = c.o_like(), o_ref = c.o_like(), lse_fast = c.lse_like(), lse_ref = c.lse_like();
  kernels::mla_attention_forward(o_fast, lse_fast, c.q, c.kv, c.k_rope, c.dn);
  kernels::ref::attention_forward<float>(o_ref.data<float>(), lse_ref.data<float>(), c.q.data<float>(),
                                         c.k.data<float>(), c.v.data<float>(), c.d);
  return {{"o", o_fast, o_ref}, {"lse", lse_fast, lse_ref}};
}

OpOutputs run_mla_backward(const MlaCase& c, uint64_t seed) {
  Tensor o = c.o_like(), lse = c.lse_like();
  kernels::ref::attention_forward<float>(o.data<float>(), lse.data<float>(), c.q.data<float>(), c.k.data<float>(),
                                         c.v.data<float>(), c.d);
  Tensor dout = random_tensor(o.shape(), DType::f32, seed, "dout");
  // Nonzero starting gradients: the kernels must add to them, not overwrite.
  Tensor dq_fast = random_tensor(c.q.shape(), DType::f32, seed, "dq0");
  Tensor dkv_fast = random_tensor(c.kv.shape(), DType::f32, seed, "dkv0");
  Tensor dr_fast = random_tensor(c.k_rope.shape(), DType::f32, seed, "dr0");
  Tensor dq_ref = dq_fast.clone(), dkv_ref = dkv_fast.clone(), dr_ref = dr_fast.clone();
  kernels::mla_attention_backward(dq_fast, dkv_fast, dr_fast, lse, dout, c.q, c.kv, c.k_rope, o, c.dn);
  Tensor dk = Tensor::zeros(c.k.shape(), DType::f32), dv = Tensor::zeros(c.v.shape(), DType::f32);
  kernels::ref::attention_backward<float>(dq_ref.data<float>(), dk.data<float>(), dv.data<float>(), lse.data<float>(),
                                          dout.data<float>(), c.q.data<float>(), c.k.data<float>(), c.v.data<float>(),
                                          o.data<float>(), c.d);
  kernels::add_columns(dkv_ref, 0, dk, 0, c.dn);
  kernels::add_columns(dkv_ref, c.dn, dv, 0, c.d.Dv);
  kernels::add_columns(dr_ref, 0, dk, c.dn, c.dr, c.d.H);
  // Storing (accumulate = false) over garbage equals adding to zeros.
  Tensor dq_store = random_tensor(c.q.shape(), DType::f32, seed, "dq1");
  Tensor dkv_store = random_tensor(c.kv.shape(), DType::f32, seed, "dkv1");
  Tensor dr_store = random_tensor(c.k_rope.shape(), DType::f32, seed, "dr1");
  kernels::mla_attention_backward(dq_store, dkv_store, dr_store, lse, dout, c.q, c.kv, c.k_rope, o, c.dn, std::nullopt,
                                  false);
  Tensor dq_zero = Tensor::zeros(c.q.shape(), DType::f32), dkv_zero = Tensor::zeros(c.kv.shape(), DType::f32);
  Tensor dr_zero = Tensor::zeros(c.k_rope.shape(), DType::f32);
  dk.zero_(), dv.zero_();
  kernels::ref::attention_backward<float>(dq_zero.data<float>(), dk.data<float>(), dv.data<float>(), lse.data<float>(),
                                          dout.data<float>(), c.q.data<float>(), c.k.data<float>(), c.v.data<float>(),
                                          o.data<float>(), c.d);
  kernels::add_columns(dkv_zero, 0, dk, 0, c.dn);
  kernels::add_columns(dkv_zero, c.dn, dv, 0, c.d.Dv);
  kernels::add_columns(dr_zero, 0, dk, c.dn, c.dr, c.d.H);
  return {{"dq", dq_fast, dq_ref},          {"dkv", dkv_fast, dkv_ref},          {"dk_rope", dr_fast, dr_ref},
          {"dq stored", dq_store, dq_zero}, {"dkv stored", dkv_store, dkv_zero}, {"dk_rope stored", dr_store, dr_zero}};
}

const std::vector<std::string> kAttentionDims = {"B", "S", "H", "Hkv", "Dqk", "Dv"};
const std::vector<std::string> kMlaDims = {"B", "S", "H", "Dn", "Dr", "Dv"};

}  // namespace

TITAN_OP_CASES(attention) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 1, 1, 16, 16},   {1, 2, 2, 1, 16, 16},   {2, 17, 4, 2, 72, 72},   {1, 63, 2, 2, 64, 64},
      {3, 65, 4, 1, 128, 128}, {1, 130, 2, 1, 192, 128}, {2, 130, 4, 4, 16, 16}, {1, 65, 4, 2, 192, 128},
      {1, 300, 2, 1, 32, 48},  // more than one group of kernel blocks (4 x 64 rows) on each side
      // bf16 on AMX (both head dims multiples of 32): S = 1, S not a multiple of 16, GQA groups
      // of 3 and 4, head dims of one, three and four tiles' worth of k, more than one key group
      // with an odd number of blocks (GQA and MHA, which write dk and dv differently).
      {1, 1, 1, 1, 32, 32},   {2, 17, 6, 2, 64, 32},  {1, 97, 4, 1, 96, 64}, {1, 300, 3, 1, 32, 32},
      {1, 129, 2, 2, 128, 96}, {1, 300, 2, 2, 64, 64},
      // MLA's head dims without GQA over more than one key group: f32 keys read in place, K = 192
      // in two chunks, dk and dv added per head.
      {2, 300, 3, 3, 192, 128},
      // The same dims with one short (diagonal) block of 13 rows: not a multiple of the 6-row
      // register tile nor of the 16-query vector that the diagonal products and softmax skip by.
      {2, 77, 2, 2, 192, 128},
  };
  const std::vector<std::vector<int64_t>> mla_shapes = {
      {2, 77, 2, 128, 64, 128}, {1, 300, 3, 128, 64, 128}, {2, 40, 3, 24, 8, 40}, {1, 1, 2, 16, 16, 16}};
  return {
      {"attention_forward", kAttentionDims, shapes,
       [](const OpInput& in) {
         const AttentionCase c(in);
         return in.dtype == DType::f32 ? run_forward<float>(c) : run_forward<bf16>(c);
       }},
      {"attention_backward", kAttentionDims, shapes,
       [](const OpInput& in) {
         const AttentionCase c(in);
         return in.dtype == DType::f32 ? run_backward<float>(c, in.seed) : run_backward<bf16>(c, in.seed);
       }},
      // MLA keys read in place (f32 kernels; bf16 assembles them for plain attention). {B, S, H,
      // Dn, Dr, Dv}: debugmodel's 128 / 64 / 128 with a short last block and over two key groups,
      // and dims that are not multiples of 16.
      {"mla_attention_forward", kMlaDims, mla_shapes, [](const OpInput& in) { return run_mla_forward(MlaCase(in)); },
       {DType::f32}},
      {"mla_attention_backward", kMlaDims, mla_shapes,
       [](const OpInput& in) { return run_mla_backward(MlaCase(in), in.seed); }, {DType::f32}},
  };
}
