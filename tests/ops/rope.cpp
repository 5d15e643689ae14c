// Rows of the op table for kernels/rope. dims = {N, H, Dh, R, rope_offset, layout (0 interleaved,
// 1 rotate_half)}; positions are random in [0, P) with P = 3N + 5, so tokens share and skip rows.
#include <cmath>

#include "common/op_table.h"
#include "titan/kernels/cpu/rope.h"
#include "titan/kernels/ref/rope.h"
#include "titan/kernels/rope.h"

using namespace titan;
using namespace titan::test;
using kernels::RopeParams;

namespace {

struct RopeCase {
  RopeParams s;
  kernels::RopeTables t;
  Tensor positions;
};

RopeCase make_case(const OpInput& in) {
  RopeCase c;
  c.s = {in.dims[0], in.dims[1], in.dims[2], in.dims[4], in.dims[3],
         in.dims[5] ? kernels::RopeLayout::rotate_half : kernels::RopeLayout::interleaved};
  kernels::RopeConfig cfg;
  cfg.rope_dims = c.s.rope_dims;
  const int64_t max_pos = 3 * c.s.tokens + 5;
  c.t = kernels::rope_tables(cfg, max_pos);
  c.positions = Tensor::empty({c.s.tokens}, DType::i32);
  Generator g(in.seed, "positions");
  for (int64_t n = 0; n < c.s.tokens; ++n) c.positions.data<int32_t>()[n] = int32_t(g.next_below(uint64_t(max_pos)));
  return c;
}

template <class T>
OpOutputs run_forward(const OpInput& in, bool in_place) {
  const RopeCase c = make_case(in);
  const Shape shape{c.s.tokens, c.s.heads, c.s.head_dim};
  const Tensor x = random_tensor(shape, in.dtype, in.seed, "x");
  Tensor fast = in_place ? x.clone() : Tensor::empty(shape, in.dtype);
  Tensor ref = Tensor::empty(shape, in.dtype);
  TITAN_CPU_KERNEL(rope_forward<T>)(fast.data<T>(), in_place ? fast.data<T>() : x.data<T>(), c.t.cos.data<float>(),
                                    c.t.sin.data<float>(), c.positions.data<int32_t>(), c.s);
  kernels::ref::rope_forward<T>(ref.data<T>(), x.data<T>(), c.t.cos.data<float>(), c.t.sin.data<float>(),
                                c.positions.data<int32_t>(), c.s);
  return {{"y", fast, ref}};
}

template <class T>
OpOutputs run_backward_written(const OpInput& in) {
  const RopeCase c = make_case(in);
  const Shape shape{c.s.tokens, c.s.heads, c.s.head_dim};
  const Tensor dy = random_tensor(shape, in.dtype, in.seed, "dy");
  Tensor fast = Tensor::full(shape, std::nan(""), in.dtype);  // written, never read
  Tensor ref = Tensor::zeros(shape, in.dtype);
  TITAN_CPU_KERNEL(rope_backward<T>)(fast.data<T>(), dy.data<T>(), c.t.cos.data<float>(), c.t.sin.data<float>(),
                                     c.positions.data<int32_t>(), c.s, false);
  kernels::ref::rope_backward<T>(ref.data<T>(), dy.data<T>(), c.t.cos.data<float>(), c.t.sin.data<float>(),
                                 c.positions.data<int32_t>(), c.s);
  return {{"dx", fast, ref}};
}

template <class T>
OpOutputs run_backward(const OpInput& in) {
  const RopeCase c = make_case(in);
  const Shape shape{c.s.tokens, c.s.heads, c.s.head_dim};
  const Tensor dy = random_tensor(shape, in.dtype, in.seed, "dy");
  Tensor fast = random_tensor(shape, in.dtype, in.seed, "dx0");  // backward accumulates
  Tensor ref = fast.clone();
  TITAN_CPU_KERNEL(rope_backward<T>)(fast.data<T>(), dy.data<T>(), c.t.cos.data<float>(), c.t.sin.data<float>(),
                                     c.positions.data<int32_t>(), c.s, true);
  kernels::ref::rope_backward<T>(ref.data<T>(), dy.data<T>(), c.t.cos.data<float>(), c.t.sin.data<float>(),
                                 c.positions.data<int32_t>(), c.s);
  return {{"dx", fast, ref}};
}

const std::vector<std::vector<int64_t>> kShapes = {
    {1, 1, 2, 2, 0, 0},      {1, 1, 2, 2, 0, 1},         {5, 3, 64, 64, 0, 0},   {5, 3, 64, 64, 0, 1},
    {7, 2, 192, 64, 128, 0},  // MLA q head: rope on the last 64 of 192
    {9, 1, 576, 64, 512, 0},  // MLA kv projection: k_pe tail
    {4, 3, 40, 18, 6, 1},     // partial rope in the middle, odd pair count
    {3, 5, 128, 128, 0, 1},   {33, 4, 96, 34, 0, 0},  {300, 16, 64, 64, 0, 0},
    // 16-lane paths (avx512_bf16): interleaved tails of 14 and 2 lanes around pass-through dims,
    // rotate_half with 23 pairs (16 + a 7-lane tail), and 80 pairs (10 table steps of 8).
    {4, 3, 40, 30, 6, 0},     {3, 2, 100, 46, 10, 1},     {5, 2, 160, 160, 0, 0}, {6, 3, 200, 160, 20, 1}};

const std::vector<std::string> kDims = {"N", "H", "Dh", "R", "rope_offset", "layout"};

}  // namespace

TITAN_OP_CASES(rope) {
  return {
      {"rope_forward", kDims, kShapes,
       [](const OpInput& in) { return in.dtype == DType::f32 ? run_forward<float>(in, false) : run_forward<bf16>(in, false); }},
      {"rope_forward_in_place", kDims, kShapes,
       [](const OpInput& in) { return in.dtype == DType::f32 ? run_forward<float>(in, true) : run_forward<bf16>(in, true); }},
      {"rope_backward", kDims, kShapes,
       [](const OpInput& in) { return in.dtype == DType::f32 ? run_backward<float>(in) : run_backward<bf16>(in); }},
      {"rope_backward_written", kDims, kShapes,
       [](const OpInput& in) {
         return in.dtype == DType::f32 ? run_backward_written<float>(in) : run_backward_written<bf16>(in);
       }},
  };
}
