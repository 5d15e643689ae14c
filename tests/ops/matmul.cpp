// Rows of the op table for kernels/matmul: the oneDNN path (through the Tensor API with
// kernel_backend() fast) against the reference triple loop (backend reference).
#include <cmath>

#include "common/op_table.h"
#include "titan/kernels/cpu/matmul.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/ref/matmul.h"

using namespace titan;
using namespace titan::test;

namespace {

// Runs f under a kernel backend and restores the previous one.
template <class F>
void with_backend(kernels::KernelBackend b, F&& f) {
  const kernels::KernelBackend saved = kernels::kernel_backend();
  kernels::set_kernel_backend(b);
  f();
  kernels::set_kernel_backend(saved);
}

// A random [..., rows, cols] tensor; with `padded` a column slice of a wider one, so its
// leading dim exceeds its row length.
Tensor operand(Shape shape, DType dtype, bool padded, uint64_t seed, std::string_view name) {
  if (!padded) return random_tensor(shape, dtype, seed, name);
  const int64_t cols = shape.back();
  shape[shape.size() - 1] = cols + 3;
  return random_tensor(shape, dtype, seed, name).slice(shape.size() - 1, 0, cols);
}

Shape matrix_shape(int64_t batch, int64_t rows, int64_t cols) {
  return batch == 0 ? Shape{rows, cols} : Shape{batch, rows, cols};
}

// Two f32 sums of K products in different orders differ by a few ulps of the partial sums, which
// grow like sqrt(K) for zero-mean inputs. A bf16 output can land one rounding step apart.
OpOutput compared(std::string name, Tensor fast, Tensor ref, int64_t k) {
  const double scale = std::sqrt(double(k));
  if (fast.dtype() == DType::bf16) return {std::move(name), fast, ref, 1e-4 * scale, 8e-3};
  return {std::move(name), fast, ref, 1e-5 * scale, 1e-5};
}

}  // namespace

TITAN_OP_CASES(matmul) {
  return {
      // dims = {batch (0: plain 2-D), M, N, K, trans_a, trans_b, scaled (alpha=0.75, beta=-1.25),
      //         shared_b (2-D B for a batched A), padded (leading dims > row length)}
      {"matmul", {"batch", "M", "N", "K", "trans_a", "trans_b", "scaled", "shared_b", "padded"},
       {{0, 1, 1, 1, 0, 0, 0, 0, 0},       {0, 7, 13, 5, 0, 0, 0, 0, 0},      {0, 7, 13, 5, 1, 0, 0, 0, 0},
        {0, 7, 13, 5, 0, 1, 0, 0, 0},       {0, 7, 13, 5, 1, 1, 1, 0, 0},      {0, 33, 65, 17, 0, 0, 1, 0, 0},
        {0, 33, 65, 17, 1, 1, 0, 0, 1},     {0, 129, 257, 63, 0, 1, 0, 0, 0},  {0, 129, 257, 63, 1, 0, 1, 0, 0},
        {3, 7, 13, 5, 0, 0, 0, 0, 0},       {3, 33, 65, 17, 1, 1, 1, 0, 0},    {3, 33, 65, 17, 0, 1, 0, 1, 0},
        {3, 33, 65, 17, 1, 0, 1, 1, 0},     {3, 33, 65, 17, 0, 0, 0, 0, 1},    {2, 129, 257, 63, 0, 1, 1, 1, 1}},
       [](const OpInput& in) {
         const auto& d = in.dims;
         const int64_t batch = d[0], m = d[1], n = d[2], k = d[3];
         const bool ta = d[4], tb = d[5], scaled = d[6], shared_b = d[7], padded = d[8];
         const Tensor a = operand(matrix_shape(batch, ta ? k : m, ta ? m : k), in.dtype, padded, in.seed, "a");
         const Tensor b = operand(matrix_shape(shared_b ? 0 : batch, tb ? n : k, tb ? k : n), in.dtype, padded,
                                  in.seed, "b");
         const float alpha = scaled ? 0.75f : 1.0f, beta = scaled ? -1.25f : 0.0f;
         OpOutputs out;
         // bf16 inputs are checked with both output types: bf16 (activations) and f32 (gradients).
         for (DType ct : in.dtype == DType::f32 ? std::vector{DType::f32} : std::vector{DType::bf16, DType::f32}) {
           const Tensor c0 = random_tensor(matrix_shape(batch, m, n), ct, in.seed, "c");
           Tensor fast = c0.clone(), ref = c0.clone();
           with_backend(kernels::KernelBackend::fast, [&] { kernels::matmul(fast, a, b, ta, tb, alpha, beta); });
           with_backend(kernels::KernelBackend::reference, [&] { kernels::matmul(ref, a, b, ta, tb, alpha, beta); });
           std::string name = "c_";
           name += dtype_name(ct);
           out.push_back(compared(name, fast, ref, k));
         }
         return out;
       }},
      // dims = {batch (0: plain 2-D), M, N, K, trans_a, trans_b, shared_b}: both gradients,
      // accumulated onto random values, in the inputs' dtype and (bf16) in f32.
      {"matmul_backward", {"batch", "M", "N", "K", "trans_a", "trans_b", "shared_b"},
       {{0, 7, 13, 5, 0, 0, 0}, {0, 7, 13, 5, 1, 0, 0}, {0, 7, 13, 5, 0, 1, 0}, {0, 33, 65, 17, 1, 1, 0},
        {3, 33, 65, 17, 0, 1, 0}, {3, 33, 65, 17, 1, 0, 0}, {3, 33, 65, 17, 0, 1, 1}, {2, 129, 63, 257, 0, 0, 1}},
       [](const OpInput& in) {
         const auto& d = in.dims;
         const int64_t batch = d[0], m = d[1], n = d[2], k = d[3];
         const bool ta = d[4], tb = d[5], shared_b = d[6];
         const Tensor a = random_tensor(matrix_shape(batch, ta ? k : m, ta ? m : k), in.dtype, in.seed, "a");
         const Tensor b = random_tensor(matrix_shape(shared_b ? 0 : batch, tb ? n : k, tb ? k : n), in.dtype, in.seed, "b");
         const Tensor dc = random_tensor(matrix_shape(batch, m, n), in.dtype, in.seed, "dc");
         OpOutputs out;
         for (DType gt : in.dtype == DType::f32 ? std::vector{DType::f32} : std::vector{DType::bf16, DType::f32}) {
           const Tensor da0 = random_tensor(a.shape(), gt, in.seed, "da"), db0 = random_tensor(b.shape(), gt, in.seed, "db");
           Tensor da_fast = da0.clone(), db_fast = db0.clone(), da_ref = da0.clone(), db_ref = db0.clone();
           with_backend(kernels::KernelBackend::fast,
                        [&] { kernels::matmul_backward(da_fast, db_fast, dc, a, b, ta, tb, 0.5f); });
           with_backend(kernels::KernelBackend::reference,
                        [&] { kernels::matmul_backward(da_ref, db_ref, dc, a, b, ta, tb, 0.5f); });
           // (appending instead of "x" + std::string(...): GCC 12 -Wrestrict misfires on the latter)
           std::string da_name = "da_", db_name = "db_";
           da_name += dtype_name(gt);
           db_name += dtype_name(gt);
           out.push_back(compared(da_name, da_fast, da_ref, n));
           out.push_back(compared(db_name, db_fast, db_ref, shared_b ? batch * m : m));
         }
         return out;
       }},
      // dims = {N (tokens), in, out, has_bias}: forward, the three accumulated gradients, and dx
      // and dw written.
      {"linear", {"N", "in", "out", "has_bias"},
       {{1, 1, 1, 1}, {7, 13, 5, 1}, {33, 65, 17, 0}, {129, 63, 257, 1}},
       [](const OpInput& in) {
         const int64_t rows = in.dims[0], nin = in.dims[1], nout = in.dims[2];
         const Tensor x = random_tensor({rows, nin}, in.dtype, in.seed, "x");
         const Tensor w = random_tensor({nout, nin}, in.dtype, in.seed, "w");
         const Tensor bias = in.dims[3] ? random_tensor({nout}, in.dtype, in.seed, "bias") : Tensor();
         const Tensor dy = random_tensor({rows, nout}, in.dtype, in.seed, "dy");
         const Tensor dx0 = random_tensor({rows, nin}, in.dtype, in.seed, "dx");
         const Tensor dw0 = random_tensor({nout, nin}, DType::f32, in.seed, "dw");
         const Tensor db0 = random_tensor({nout}, DType::f32, in.seed, "db");
         struct Result { Tensor y, dx, dw, db, dx_written, dw_written; };
         auto run = [&](kernels::KernelBackend backend) {
           Result r{Tensor::empty({rows, nout}, in.dtype), dx0.clone(), dw0.clone(), db0.clone(), Tensor(), Tensor()};
           with_backend(backend, [&] {
             kernels::linear_forward(r.y, x, w, bias);
             kernels::linear_backward(r.dx, r.dw, r.db, dy, x, w);
             // dx written over (accumulate_dx false): a NaN-filled buffer must come out as dy @ w.
             r.dx_written = Tensor::full({rows, nin}, std::nan(""), in.dtype);
             Tensor none;
             kernels::linear_backward(r.dx_written, none, none, dy, x, w, false);
             // dw written over (accumulate_dw false, a stale gradient after zero_grad): likewise.
             r.dw_written = Tensor::full({nout, nin}, std::nan(""), DType::f32);
             kernels::linear_backward(none, r.dw_written, none, dy, x, w, true, false);
           });
           return r;
         };
         const Result fast = run(kernels::KernelBackend::fast), ref = run(kernels::KernelBackend::reference);
         return OpOutputs{compared("y", fast.y, ref.y, nin), compared("dx", fast.dx, ref.dx, nout),
                          compared("dw", fast.dw, ref.dw, rows), compared("db", fast.db, ref.db, rows),
                          compared("dx_written", fast.dx_written, ref.dx_written, nout),
                          compared("dw_written", fast.dw_written, ref.dw_written, rows)};
       }},
      // dims = {rows, cols}: the per-ISA column sum against the reference's.
      {"linear_bias_backward", {"rows", "cols"},
       {{1, 1}, {7, 13}, {1000, 33}, {3, 5000}},
       [](const OpInput& in) {
         const int64_t rows = in.dims[0], cols = in.dims[1];
         const Tensor dy = random_tensor({rows, cols}, in.dtype, in.seed, "dy");
         Tensor fast = random_tensor({cols}, DType::f32, in.seed, "db"), ref = fast.clone();
         if (in.dtype == DType::f32) {
           TITAN_CPU_KERNEL(linear_bias_backward<float>)(fast.data<float>(), dy.data<float>(), rows, cols);
           kernels::ref::linear_bias_backward<float>(ref.data<float>(), dy.data<float>(), rows, cols);
         } else {
           TITAN_CPU_KERNEL(linear_bias_backward<bf16>)(fast.data<float>(), dy.data<bf16>(), rows, cols);
           kernels::ref::linear_bias_backward<bf16>(ref.data<float>(), dy.data<bf16>(), rows, cols);
         }
         return OpOutputs{{"db", fast, ref, 0.0, 0.0}};  // same order of the same f32 adds: bit-exact
       }},
  };
}
