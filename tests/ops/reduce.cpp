// Rows of the op table for kernels/reduce. Row reductions: dims = {N, D}; whole-tensor ones:
// dims = {n} (70001 and 100000 span several fixed blocks of the fast kernels).
#include "common/backend_compare.h"
#include "titan/kernels/reduce.h"

using namespace titan;
using namespace titan::test;

namespace {
const std::vector<std::vector<int64_t>> kRowShapes = {{1, 1}, {1, 7}, {3, 33}, {5, 129}, {2, 1000}, {3, 4097}, {300, 64}};
const std::vector<std::vector<int64_t>> kFlatShapes = {{1}, {7}, {33}, {1000}, {4097}, {70001}, {100000}};
const std::vector<std::string> kRowDims = {"N", "D"}, kFlatDims = {"n"};

// A double result as a one-element f32 tensor, so the table can compare it.
Tensor scalar(double v) { return Tensor::full({1}, v, DType::f32); }
}  // namespace

TITAN_OP_CASES(reduce) {
  return {
      {"sum_rows", kRowDims, kRowShapes,
       [](const OpInput& in) {
         const Tensor x = random_tensor({in.dims[0], in.dims[1]}, in.dtype, in.seed, "x");
         return fast_vs_reference({"sum", "mean"}, [&] {
           Tensor s = Tensor::empty({in.dims[0]}, in.dtype), m = Tensor::empty({in.dims[0]}, in.dtype);
           kernels::sum_rows(s, x);
           kernels::mean_rows(m, x);
           return std::vector<Tensor>{s, m};
         });
       }},
      {"sum_rows_backward", kRowDims, kRowShapes,
       [](const OpInput& in) {
         const Tensor dy = random_tensor({in.dims[0]}, in.dtype, in.seed, "dy");
         const Tensor dx0 = random_tensor({in.dims[0], in.dims[1]}, in.dtype, in.seed, "dx");
         return fast_vs_reference({"dx"}, [&] {
           Tensor dx = dx0.clone();
           kernels::sum_rows_backward(dx, dy, 1.0 / double(in.dims[1]));
           return std::vector<Tensor>{dx};
         });
       }},
      {"max_rows", kRowDims, kRowShapes,
       [](const OpInput& in) {
         Tensor x32 = random_tensor({in.dims[0], in.dims[1]}, DType::f32, in.seed, "x");
         // A tie in row 0: the first index must win.
         if (in.dims[1] >= 3) x32.data<float>()[1] = x32.data<float>()[2] = 5.0f;
         const Tensor x = x32.to(in.dtype);
         const Tensor dy = random_tensor({in.dims[0]}, in.dtype, in.seed, "dy");
         const Tensor dx0 = random_tensor(x.shape(), in.dtype, in.seed, "dx");
         OpOutputs out = fast_vs_reference({"max", "argmax", "dx"}, [&] {
           Tensor m = Tensor::empty({in.dims[0]}, in.dtype), arg = Tensor::empty({in.dims[0]}, DType::i32);
           Tensor dx = dx0.clone();
           kernels::max_rows(m, arg, x);
           kernels::max_rows_backward(dx, arg, dy);
           return std::vector<Tensor>{m, arg, dx};
         });
         for (OpOutput& o : out) o.atol = o.rtol = 0;  // selection is exact
         return out;
       }},
      {"sum_all", kFlatDims, kFlatShapes,
       [](const OpInput& in) {
         const Tensor x = random_tensor({in.dims[0]}, in.dtype, in.seed, "x", -1, 3);
         OpOutputs out = fast_vs_reference({"sum", "mean", "sum_squares"}, [&] {
           // Two buffers, as the gradient norm sees a list of parameters' gradients.
           const std::vector<Tensor> grads = {x, x.slice(0, 0, (in.dims[0] + 1) / 2).contiguous()};
           return std::vector<Tensor>{scalar(kernels::sum_all(x)), scalar(kernels::mean_all(x)),
                                      scalar(kernels::sum_squares(grads))};
         });
         // The results are f32 totals of values already rounded to the input dtype on both sides.
         for (OpOutput& o : out) o.atol = 1e-6, o.rtol = 1e-5;
         return out;
       }},
      {"sum_all_backward", kFlatDims, kFlatShapes,
       [](const OpInput& in) {
         const Tensor dx0 = random_tensor({in.dims[0]}, in.dtype, in.seed, "dx");
         return fast_vs_reference({"dx"}, [&] {
           Tensor dx = dx0.clone();
           kernels::sum_all_backward(dx, 0.3);
           return std::vector<Tensor>{dx};
         });
       }},
  };
}
