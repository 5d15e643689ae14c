// Rows of the op table for kernels/elementwise. dims = {n}. Gradients start non-zero so the
// rows check that backward accumulates.
#include "common/backend_compare.h"
#include "titan/kernels/elementwise.h"

using namespace titan;
using namespace titan::test;

namespace {
const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {33}, {129}, {1000}, {4097}, {70001}};

Tensor input(const OpInput& in, std::string_view name) { return random_tensor({in.dims[0]}, in.dtype, in.seed, name); }
}  // namespace

TITAN_OP_CASES(elementwise) {
  return {
      {"add", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor a = input(in, "a"), b = input(in, "b");
         return fast_vs_reference({"y", "y_inplace"}, [&] {
           Tensor y = Tensor::empty(a.shape(), in.dtype), h = a.clone();
           kernels::add(y, a, b, -0.75);
           kernels::add(h, h, b);  // the in-place residual add
           return std::vector<Tensor>{y, h};
         });
       }},
      {"add_backward", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor dy = input(in, "dy"), da0 = input(in, "da"), db0 = input(in, "db");
         return fast_vs_reference({"da", "db", "db_only"}, [&] {
           Tensor da = da0.clone(), db = db0.clone(), db_only = db0.clone(), none;
           kernels::add_backward(da, db, dy, 0.5);
           kernels::add_backward(none, db_only, dy, 0.5);
           return std::vector<Tensor>{da, db, db_only};
         });
       }},
      {"mul", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor a = input(in, "a"), b = input(in, "b");
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(a.shape(), in.dtype);
           kernels::mul(y, a, b);
           return std::vector<Tensor>{y};
         });
       }},
      {"mul_backward", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor dy = input(in, "dy"), a = input(in, "a"), b = input(in, "b"), g0 = input(in, "g");
         return fast_vs_reference({"da", "db", "da_only"}, [&] {
           Tensor da = g0.clone(), db = g0.clone(), da_only = g0.clone(), none;
           kernels::mul_backward(da, db, dy, a, b);
           kernels::mul_backward(da_only, none, dy, a, b);
           return std::vector<Tensor>{da, db, da_only};
         });
       }},
      {"scale", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor x = input(in, "x");
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(x.shape(), in.dtype);
           kernels::scale(y, x, 3.25);
           return std::vector<Tensor>{y};
         });
       }},
      {"axpby", {"n"}, kShapes,
       [](const OpInput& in) {
         const Tensor x = input(in, "x"), y0 = input(in, "y");
         return fast_vs_reference({"y"}, [&] {
           Tensor y = y0.clone();
           kernels::axpby(y, x, -1.5, 0.9);
           return std::vector<Tensor>{y};
         });
       }},
  };
}
