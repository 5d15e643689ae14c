// Reductions across rows (weight gradients, whole-tensor sums) must not depend on the thread
// count, so a run resumed on a different machine (or OMP_NUM_THREADS) continues bit-identically.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "common/kernel_check.h"
#include "titan/kernels/norm.h"
#include "titan/kernels/reduce.h"

using namespace titan;
using namespace titan::test;

namespace {

// Results of every cross-row reduction on one input, computed with `threads` OpenMP threads.
struct Results {
  std::vector<float> rms_dw, ln_dw, ln_db;
  double sum = 0, sum_squares = 0;
};

Results run_with_threads(int threads, DType dtype) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const int64_t N = 1000, D = 96;  // 16 row blocks of the weight-gradient reduction, a partial one last
  const Tensor x = random_tensor({N, D}, dtype, 5, "x"), dy = random_tensor({N, D}, dtype, 5, "dy");
  const Tensor w = random_tensor({D}, DType::f32, 5, "w"), b = random_tensor({D}, DType::f32, 5, "b");
  Tensor y = Tensor::empty({N, D}, dtype), dx = Tensor::zeros({N, D}, dtype);
  Tensor rstd = Tensor::empty({N}, DType::f32), mean = Tensor::empty({N}, DType::f32);
  Tensor rms_dw = Tensor::zeros({D}, DType::f32), ln_dw = Tensor::zeros({D}, DType::f32);
  Tensor ln_db = Tensor::zeros({D}, DType::f32);
  kernels::rmsnorm_forward(y, rstd, x, w, 1e-5);
  kernels::rmsnorm_backward(dx, rms_dw, rstd, dy, x, w);
  kernels::layernorm_forward(y, mean, rstd, x, w, b, 1e-5);
  kernels::layernorm_backward(dx, ln_dw, ln_db, mean, rstd, dy, x, w);
  const Tensor big = random_tensor({300001}, dtype, 5, "big");
  const std::vector<Tensor> grads = {big, x};
  Results r;
  auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
  r.rms_dw = values(rms_dw);
  r.ln_dw = values(ln_dw);
  r.ln_db = values(ln_db);
  r.sum = kernels::sum_all(big);
  r.sum_squares = kernels::sum_squares(grads);
  omp_set_num_threads(saved);
  return r;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(KernelsReductionDeterminism, SameBitsForAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Results one = run_with_threads(1, dtype);
    for (int threads : {2, 3, 7}) {
      const Results many = run_with_threads(threads, dtype);
      EXPECT_TRUE(bit_equal(one.rms_dw, many.rms_dw)) << "rmsnorm dw, " << threads << " threads";
      EXPECT_TRUE(bit_equal(one.ln_dw, many.ln_dw)) << "layernorm dw, " << threads << " threads";
      EXPECT_TRUE(bit_equal(one.ln_db, many.ln_db)) << "layernorm db, " << threads << " threads";
      EXPECT_EQ(one.sum, many.sum) << threads << " threads";
      EXPECT_EQ(one.sum_squares, many.sum_squares) << threads << " threads";
    }
  }
}

}  // namespace
