// Rows of the op table for kernels/activation. dims = {n}. Inputs span [-12, 12] so both
// saturated tails of the sigmoid are covered; gradients start non-zero (backward accumulates).
#include <cmath>

#include "common/backend_compare.h"
#include "titan/kernels/activation.h"

using namespace titan;
using namespace titan::test;

namespace {
const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {33}, {129}, {1000}, {4097}, {70001}};
// Forward outputs of 16 MiB and more are written with streaming stores (kernels/cpu/chunks.h);
// 8.4M elements cross that in bf16 and f32.
const std::vector<std::vector<int64_t>> kForwardShapes = {{1},    {7},    {33},    {129},
                                                          {1000}, {4097}, {70001}, {8400001}};

Tensor input(const OpInput& in, std::string_view name, double range = 1) {
  return random_tensor({in.dims[0]}, in.dtype, in.seed, name, -range, range);
}

// DeepSeek-V4's swiglu_limit (exact in bf16), with inputs spanning twice it: both clamps bite, and
// every 7th gate / 5th up sits exactly on a bound, where the gradient still passes.
constexpr double kLimit = 1.5;
Tensor limited_input(const OpInput& in, std::string_view name, int every, bool negative_bound) {
  Tensor x = input(in, name, 2 * kLimit).to(DType::f32);
  for (int64_t i = 0; i < x.numel(); i += every) {
    x.data<float>()[i] = float(negative_bound && (i / every) % 2 ? -kLimit : kLimit);
  }
  return x.to(in.dtype);
}
}  // namespace

TITAN_OP_CASES(activation) {
  return {
      {"silu_forward", {"n"}, kForwardShapes,
       [](const OpInput& in) {
         const Tensor x = input(in, "x", 12);
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(x.shape(), in.dtype);
           kernels::silu_forward(y, x);
           return std::vector<Tensor>{y};
         });
       }},
      {"silu_backward", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor x = input(in, "x", 12), dy = input(in, "dy"), dx0 = input(in, "dx");
         return fast_vs_reference({"dx"}, [&] {
           Tensor dx = dx0.clone();
           kernels::silu_backward(dx, dy, x);
           return std::vector<Tensor>{dx};
         });
       }},
      {"swiglu_forward", {"n"}, kForwardShapes,
       [](const OpInput& in) {
         const Tensor gate = input(in, "gate", 12), up = input(in, "up", 2);
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(gate.shape(), in.dtype);
           kernels::swiglu_forward(y, gate, up);
           return std::vector<Tensor>{y};
         });
       }},
      // Gates far in both tails, where the sigmoid saturates (exp over- or underflows): the
      // outputs must stay finite and near 0 or gate * up.
      {"swiglu_forward_tails", {"n"}, {{11}, {37}},
       [](const OpInput& in) {
         const float tails[] = {-1e4f, -200.0f, -100.0f, -88.5f, -87.0f, -30.0f, 30.0f, 87.0f, 88.5f, 100.0f, 1e4f};
         Tensor gate32 = Tensor::empty({in.dims[0]}, DType::f32);
         for (int64_t i = 0; i < in.dims[0]; ++i) gate32.data<float>()[i] = tails[i % 11];
         const Tensor gate = gate32.to(in.dtype), up = input(in, "up", 2);
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(gate.shape(), in.dtype);
           kernels::swiglu_forward(y, gate, up);
           return std::vector<Tensor>{y};
         });
       }},
      {"swiglu_forward_limit", {"n"}, kForwardShapes,
       [](const OpInput& in) {
         const Tensor gate = limited_input(in, "gate", 7, false), up = limited_input(in, "up", 5, true);
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(gate.shape(), in.dtype);
           kernels::swiglu_forward(y, gate, up, kLimit);
           return std::vector<Tensor>{y};
         });
       }},
      {"swiglu_backward_limit", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor gate = limited_input(in, "gate", 7, false), up = limited_input(in, "up", 5, true);
         const Tensor dy = input(in, "dy"), dgate0 = input(in, "dgate"), dup0 = input(in, "dup");
         return fast_vs_reference({"dgate", "dup", "dgate_written", "dup_written"}, [&] {
           Tensor dgate = dgate0.clone(), dup = dup0.clone();
           kernels::swiglu_backward(dgate, dup, dy, gate, up, true, kLimit);
           Tensor dgate_w = Tensor::full(gate.shape(), std::nan(""), in.dtype), dup_w = dgate_w.clone();
           kernels::swiglu_backward(dgate_w, dup_w, dy, gate, up, false, kLimit);
           return std::vector<Tensor>{dgate, dup, dgate_w, dup_w};
         });
       }},
      {"swiglu_backward", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor gate = input(in, "gate", 12), up = input(in, "up", 2), dy = input(in, "dy");
         const Tensor dgate0 = input(in, "dgate"), dup0 = input(in, "dup");
         return fast_vs_reference({"dgate", "dup", "dgate_written", "dup_written"}, [&] {
           Tensor dgate = dgate0.clone(), dup = dup0.clone();
           kernels::swiglu_backward(dgate, dup, dy, gate, up);
           // written over (accumulate false): NaN-filled buffers must come out as the gradients alone
           Tensor dgate_w = Tensor::full(gate.shape(), std::nan(""), in.dtype), dup_w = dgate_w.clone();
           kernels::swiglu_backward(dgate_w, dup_w, dy, gate, up, false);
           return std::vector<Tensor>{dgate, dup, dgate_w, dup_w};
         });
       }},
  };
}
