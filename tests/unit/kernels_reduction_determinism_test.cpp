// Reductions across rows (weight gradients, whole-tensor sums) must not depend on the thread
// count, so a run resumed on a different machine (or OMP_NUM_THREADS) continues bit-identically.
// The DSA kernels' scatter-adds (sparse MLA's dkv, the indexer losses' dk) sum per-thread
// partials, so theirs may depend on the thread count, but not on how a run's threads happened to
// be scheduled: the same call gives the same bits every time.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "common/kernel_check.h"
#include "common/sparse_mla_inputs.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/norm.h"
#include "titan/kernels/reduce.h"
#include "titan/kernels/sparse_mla.h"

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

// The gradients (and losses) of the DSA kernels from one call, as raw bytes.
std::vector<std::vector<char>> dsa_results(DType dtype) {
  const int64_t S = 96, H = 4, Dqk = 64, Dv = 32, K = 24, HI = 4, DI = 64, Hm = 3, Dm = 32;
  auto bytes = [](const Tensor& t) {
    const char* p = static_cast<const char*>(t.data_ptr());
    return std::vector<char>(p, p + t.numel() * int64_t(dtype_bits(t.dtype()) / 8));
  };
  std::vector<std::vector<char>> out;
  // Sparse MLA, forward then backward.
  const Tensor q = random_tensor({1, S, H, Dqk}, dtype, 3, "q"), kv = random_tensor({1, S, Dqk}, dtype, 3, "kv");
  const Tensor idx = random_sparse_idx(1, S, S, K, 3, "idx"), dout = random_tensor({1, S, H, Dv}, dtype, 3, "do");
  Tensor o = Tensor::empty({1, S, H, Dv}, dtype), lse = Tensor::empty({1, S, H}, DType::f32);
  kernels::sparse_mla_forward(o, lse, q, kv, idx, Dv, 0.125);
  Tensor dq = Tensor::empty(q.shape(), dtype), dkv = Tensor::empty(kv.shape(), dtype);
  kernels::sparse_mla_backward(dq, dkv, dout, q, kv, idx, o, lse, 0.125);
  out.push_back(bytes(dq)), out.push_back(bytes(dkv));
  // Indexer losses, sparse stage (4-head rows) and dense warm-up.
  const Tensor iq = random_tensor({1, S, HI, DI}, dtype, 4, "iq"), ik = random_tensor({1, S, DI}, dtype, 4, "ik");
  const Tensor w = random_tensor({1, S, HI}, DType::f32, 4, "w");
  const Tensor target = random_tensor({1, S, K}, DType::f32, 4, "target", 0, 1);
  Tensor idq = Tensor::empty(iq.shape(), dtype), idk = Tensor::empty(ik.shape(), dtype);
  Tensor dw = Tensor::empty(w.shape(), DType::f32);
  double loss = kernels::indexer_kl_loss_sparse(idq, idk, dw, iq, ik, w, idx, target, 1.0);
  out.push_back(bytes(idq)), out.push_back(bytes(idk)), out.push_back(bytes(dw));
  out.emplace_back(reinterpret_cast<const char*>(&loss), reinterpret_cast<const char*>(&loss) + sizeof loss);
  const Tensor mq = random_tensor({1, S, Hm, Dm}, dtype, 5, "mq", -2, 2), mk = random_tensor({1, S, Hm, Dm}, dtype, 5, "mk");
  const Tensor mlse = random_tensor({1, S, Hm}, DType::f32, 5, "mlse", 1, 3);
  loss = kernels::indexer_kl_loss(idq, idk, dw, iq, ik, w, mq, mk, mlse, 0.3, 1.0);
  out.push_back(bytes(idq)), out.push_back(bytes(idk)), out.push_back(bytes(dw));
  out.emplace_back(reinterpret_cast<const char*>(&loss), reinterpret_cast<const char*>(&loss) + sizeof loss);
  return out;
}

TEST(KernelsReductionDeterminism, DsaScatterAddsSameBitsEveryRun) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);  // more threads than this machine's cores: the schedule varies run to run
  for (DType dtype : {DType::f32, DType::bf16}) {
    const auto first = dsa_results(dtype);
    const char* names[] = {"sparse MLA dq", "sparse MLA dkv", "sparse loss dq", "sparse loss dk", "sparse loss dw",
                           "sparse loss", "dense loss dq", "dense loss dk", "dense loss dw", "dense loss"};
    for (int run = 1; run < 8; ++run) {
      const auto again = dsa_results(dtype);
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_TRUE(first[i] == again[i]) << names[i] << ", " << dtype_name(dtype) << ", run " << run;
      }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
