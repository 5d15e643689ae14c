// Rows of the op table for kernels/lightning_indexer (fast vs reference twin, f32 and bf16, every
// ISA level). Awkward shapes: S = 1 (t = 0 only), S < K (every row selects all its keys), odd head
// dims (DI = 17, D = 19 are not multiples of a vector), Skv > S (queries are the last S of the
// keys), S and Skv around and across the 64-key block, HI = 1 and HI = 64 (one query per top-k block);
// sparse-stage blocks (given per-slot target) that select most of their keys (blocked path with
// AMX) and few (gathered path: narrow and wide rows);
// top-k rows with far more keys than K (the candidate buffer is compacted many times).
// The loss rows redraw query heads whose dot with a key is within rounding of zero
// (IndexerCase::avoid_dots_near_zero: the ReLU's indicator would be a coin flip).
#include <cmath>
#include <vector>

#include "common/op_table.h"
#include "common/sparse_mla_inputs.h"
#include "titan/core/error.h"
#include "titan/kernels/cpu/lightning_indexer.h"
#include "titan/kernels/ref/lightning_indexer.h"

using namespace titan;
using namespace titan::test;

namespace {

struct IndexerCase {
  kernels::IndexerParams d;
  kernels::IndexerTargetParams td;
  Tensor q, k, w, mq, mk, mlse, idx;
  uint64_t seed = 0;
  bool invalid_slots = false;  // sparse loss: random selections with -1, future and >= Skv slots
  bool edited_slots = false;   // sparse loss: top-k selections with repeated keys and invalid slots

  // dims = {B, S, Skv, HI, DI, K} (+ {H, Hk, D} for the dense loss, K = 0; + {invalid} for the
  // sparse loss; + {0, ratio} for compressed keys, + {0, ratio, P0} for a context-parallel chunk's
  // queries from position P0 over the entries up to their end).
  explicit IndexerCase(const OpInput& in) : seed(in.seed) {
    d.B = in.dims[0], d.S = in.dims[1], d.Skv = in.dims[2], d.HI = in.dims[3], d.DI = in.dims[4], d.K = in.dims[5];
    q = random_tensor({d.B, d.S, d.HI, d.DI}, in.dtype, in.seed, "q");
    k = random_tensor({d.B, d.Skv, d.DI}, in.dtype, in.seed, "k");
    w = random_tensor({d.B, d.S, d.HI}, DType::f32, in.seed, "w");
    const bool dense_loss = in.dims.size() == 9 && d.K == 0;
    invalid_slots = !dense_loss && in.dims.size() >= 7 && in.dims[6] == 1;
    edited_slots = !dense_loss && in.dims.size() >= 7 && in.dims[6] == 2;
    if (!dense_loss && in.dims.size() >= 8) d.ratio = in.dims[7];  // compressed keys (V4's CSA): {.., slots, ratio}
    if (!dense_loss && in.dims.size() == 9) d.P0 = in.dims[8];     // {.., slots, ratio, first position}
    if (dense_loss) {
      td.H = in.dims[6], td.Hk = in.dims[7], td.D = in.dims[8], td.scale = 0.3;
      mq = random_tensor({d.B, d.S, td.H, td.D}, in.dtype, in.seed, "mq", -2, 2);
      mk = random_tensor({d.B, d.Skv, td.Hk, td.D}, in.dtype, in.seed, "mk");
      // Any finite lse works for comparing the kernels; this one keeps the target near 1 / H.
      mlse = random_tensor({d.B, d.S, td.H}, DType::f32, in.seed, "mlse", 1, 3);
    }
  }
  // The loss's gradients take the ReLU's indicator 1[q_j . k_s > 0], so a dot within rounding
  // of zero may land on either side in the fast kernel and in the reference, whose f32 sums run
  // in different orders, and then dq_j and dk_s differ by a whole term g w_j k_s (or g w_j q_j).
  // It happened: avx2, 90 queries x 400 keys, DI = 64, seed 40: an exact dot of -3.3e-7 summed
  // to +6.0e-8 in the reference's order and to -5.4e-7 in the kernel's (dq off by x1298 of the
  // tolerance). So each query head row with such a dot against any key is redrawn until
  // |q_j . k_s| > DI 2^-23 sum_c |q_jc k_sc|, twice the bound on the error of an f32 sum of DI
  // products in any order (gamma_DI ~ DI 2^-24), which puts every dot's sign beyond rounding.
  // Few rows are redrawn (about 2 in 10^5 of this table's pairs fall inside); the inputs otherwise
  // stay as drawn. Reads the stored (rounded) q and k, so it holds for bf16 too.
  void avoid_dots_near_zero() {
    const Tensor kf = k.to(DType::f32);
    Generator g(seed, "q redraw");
    std::vector<double> qj(static_cast<size_t>(d.DI));
    // True when head row qj has a dot within rounding of zero with a key of batch b.
    auto near_zero = [&](int64_t b) {
      for (int64_t s = 0; s < d.Skv; ++s) {
        const float* ks = kf.data<float>() + (b * d.Skv + s) * d.DI;
        double dot = 0, magnitude = 0;
        for (int64_t c = 0; c < d.DI; ++c) {
          dot += qj[size_t(c)] * ks[c];
          magnitude += std::fabs(qj[size_t(c)] * ks[c]);
        }
        if (std::fabs(dot) <= double(d.DI) * 0x1p-23 * magnitude) return true;
      }
      return false;
    };
    for (int64_t r = 0; r < d.B * d.S * d.HI; ++r) {  // query head rows
      const int64_t b = r / (d.S * d.HI);
      for (int64_t c = 0; c < d.DI; ++c) qj[size_t(c)] = load_as_double(q.data_ptr(), q.dtype(), r * d.DI + c);
      for (int redraws = 0; near_zero(b); ++redraws) {
        TITAN_CHECK(redraws < 100, "indexer op test: no query row keeps its dots away from zero");
        for (int64_t c = 0; c < d.DI; ++c) {  // a fresh row in [-1, 1) (as drawn), rounded to q's dtype
          store_from_double(q.data_ptr(), q.dtype(), r * d.DI + c, 2.0 * g.next_uniform() - 1.0);
          qj[size_t(c)] = load_as_double(q.data_ptr(), q.dtype(), r * d.DI + c);
        }
      }
    }
  }
  template <class T>
  void select() {  // idx from the reference top-k (the sparse stage's selection)
    if (invalid_slots) {  // early rows draw mostly future keys: some have no valid slot
      idx = random_sparse_idx(d.B, d.S, d.Skv, d.K, seed, "idx", {false, 0.2});
      return;
    }
    idx = Tensor::empty({d.B, d.S, d.K}, DType::i32);
    kernels::ref::indexer_topk<T>(idx.data<int32_t>(), q.data<T>(), k.data<T>(), w.data<float>(), d);
    if (!edited_slots) return;
    // Ascending rows (the fast path's case) with -1 and >= Skv slots among the valid ones (rows
    // t % 3 == 1); rows that repeat the slot before them (a key listed twice: t % 3 == 0, the
    // deduplicating path); the rest as top-k wrote them.
    Generator g(seed, "edit");
    int32_t* rows = idx.data<int32_t>();
    for (int64_t r = 0; r < d.B * d.S; ++r) {
      int32_t* row = rows + r * d.K;
      for (int64_t j = 1; j < d.K; ++j) {
        if (g.next_uniform() >= 0.15f) continue;
        if (r % 3 == 0) row[j] = row[j - 1];
        if (r % 3 == 1) row[j] = j % 2 ? -1 : int32_t(d.Skv + j);
      }
    }
  }
};

template <class T>
OpOutputs run_topk(const IndexerCase& c) {
  Tensor fast = Tensor::empty({c.d.B, c.d.S, c.d.K}, DType::i32), ref = fast.clone();
  TITAN_CPU_KERNEL(indexer_topk<T>)(fast.data<int32_t>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(), c.d);
  kernels::ref::indexer_topk<T>(ref.data<int32_t>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(), c.d);
  return {{"idx", fast, ref, 0, 0}};
}

template <class T>
OpOutputs run_loss(IndexerCase& c) {
  c.avoid_dots_near_zero();  // before the selection, which reads q
  const DType dt = c.q.dtype();
  Tensor dq_f = Tensor::empty(c.q.shape(), dt), dk_f = Tensor::empty(c.k.shape(), dt),
         dw_f = Tensor::empty(c.w.shape(), DType::f32);
  Tensor dq_r = dq_f.clone(), dk_r = dk_f.clone(), dw_r = dw_f.clone();
  Tensor loss_f = Tensor::empty({1}, DType::f32), loss_r = loss_f.clone();
  if (c.d.K == 0) {  // dense stage: the target recomputed from the main attention
    loss_f.data<float>()[0] = float(TITAN_CPU_KERNEL(indexer_kl_loss<T>)(
        dq_f.data<T>(), dk_f.data<T>(), dw_f.data<float>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(),
        c.mq.data<T>(), c.mk.data<T>(), c.mlse.data<float>(), c.d, c.td, 0.7));
    loss_r.data<float>()[0] = float(kernels::ref::indexer_kl_loss<T>(
        dq_r.data<T>(), dk_r.data<T>(), dw_r.data<float>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(),
        c.mq.data<T>(), c.mk.data<T>(), c.mlse.data<float>(), nullptr, c.d, c.td, 0.7));
  } else {  // sparse stage: the target given per slot (any nonnegative values compare the kernels)
    c.select<T>();
    const Tensor target = random_tensor({c.d.B, c.d.S, c.d.K}, DType::f32, c.seed, "target", 0, 1);
    loss_f.data<float>()[0] = float(TITAN_CPU_KERNEL(indexer_kl_loss_sparse<T>)(
        dq_f.data<T>(), dk_f.data<T>(), dw_f.data<float>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(),
        c.idx.data<int32_t>(), target.data<float>(), c.d, 0.7));
    loss_r.data<float>()[0] = float(kernels::ref::indexer_kl_loss_sparse<T>(
        dq_r.data<T>(), dk_r.data<T>(), dw_r.data<float>(), c.q.data<T>(), c.k.data<T>(), c.w.data<float>(),
        c.idx.data<int32_t>(), target.data<float>(), c.d, 0.7));
  }
  return {{"loss", loss_f, loss_r}, {"dq", dq_f, dq_r}, {"dk", dk_f, dk_r}, {"dw", dw_f, dw_r}};
}

template <class T>
OpOutputs run_hadamard(const OpInput& in) {
  Tensor fast = random_tensor({in.dims[0], in.dims[1]}, in.dtype, in.seed, "x"), ref = fast.clone();
  TITAN_CPU_KERNEL(hadamard_transform<T>)(fast.data<T>(), in.dims[0], in.dims[1]);
  kernels::ref::hadamard_transform<T>(ref.data<T>(), in.dims[0], in.dims[1]);
  return {{"x", fast, ref}};
}

}  // namespace

TITAN_OP_CASES(lightning_indexer) {
  return {
      {"indexer_topk", {"B", "S", "Skv", "HI", "DI", "K", "slots (unused)", "ratio", "P0"},
       // B, S, Skv, HI, DI, K
       {{1, 1, 1, 1, 1, 1}, {1, 1, 70, 3, 17, 8}, {2, 9, 9, 4, 64, 16}, {1, 100, 100, 4, 64, 7},
        {2, 130, 150, 2, 33, 40}, {1, 70, 200, 1, 16, 64}, {1, 3, 100, 64, 32, 5},
        // many candidate-buffer compactions per row (sampled floor estimates, vectorized appends)
        {1, 300, 1100, 3, 24, 100},
        // compressed keys (V4's CSA, ratio 4 and 3): early queries see none, then floor((t + 1) / m)
        {2, 64, 16, 4, 64, 8, 0, 4}, {1, 130, 43, 3, 17, 40, 0, 3}, {1, 600, 150, 2, 32, 64, 0, 4},
        // a context-parallel chunk: queries from position P0 over every entry up to their end
        {2, 16, 16, 4, 64, 8, 0, 4, 48}, {1, 43, 40, 3, 17, 40, 0, 3, 77}, {1, 150, 300, 2, 32, 64, 0, 4, 1050}},
       [](const OpInput& in) {
         const IndexerCase c(in);
         return in.dtype == DType::f32 ? run_topk<float>(c) : run_topk<bf16>(c);
       }},
      {"indexer_kl_loss", {"B", "S", "Skv", "HI", "DI", "K", "H", "Hk", "D"},
       // B, S, Skv, HI, DI, 0 (dense stage), H, Hk, D
       {{1, 1, 1, 1, 16, 0, 2, 2, 16}, {2, 17, 17, 3, 17, 0, 4, 4, 19}, {1, 70, 90, 4, 64, 0, 4, 1, 32},
        {1, 130, 130, 2, 16, 0, 2, 2, 24}},
       [](const OpInput& in) {
         IndexerCase c(in);
         return in.dtype == DType::f32 ? run_loss<float>(c) : run_loss<bf16>(c);
       }},
      {"indexer_kl_loss_sparse", {"B", "S", "Skv", "HI", "DI", "K", "slots", "ratio", "P0"},
       // B, S, Skv, HI, DI, K: selections covering most of the causal keys (blocked path), HI = 64
       {{1, 1, 1, 1, 16, 1}, {1, 5, 5, 2, 16, 8}, {2, 40, 50, 3, 17, 16}, {1, 150, 150, 4, 32, 70},
        {1, 3, 80, 64, 16, 33},
        // selections far below the causal count: the gathered per-row path, one and several
        // 64-key column blocks per row
        {1, 130, 300, 2, 16, 20}, {2, 70, 200, 3, 17, 24}, {1, 90, 400, 4, 64, 130},
        // random selections with -1, future and >= Skv slots (rows without a valid slot): both paths
        {2, 20, 20, 3, 16, 2, 1}, {1, 100, 120, 2, 16, 40, 1}, {1, 80, 300, 4, 32, 16, 1},
        // gathered rows without AMX: narrow with 5 to 15 heads (the 16-key fold), wide with 16 and
        // 17 heads (heads as GEMM columns, padded to 32), over 256 selected keys (dk in chunks),
        // S < K, and narrow heads with DI > 128 (taken wide); -1 slots in wide rows
        {1, 60, 90, 7, 24, 30}, {1, 40, 60, 15, 64, 20}, {1, 50, 70, 16, 32, 12}, {2, 30, 40, 17, 17, 9},
        {1, 12, 300, 16, 16, 270}, {1, 6, 6, 20, 16, 9}, {1, 30, 50, 3, 144, 10}, {1, 40, 60, 17, 16, 20, 1},
        // top-k selections with repeated keys and invalid slots among ascending valid ones, over
        // every narrow 4-head row width (DI 16, 32, 48, 64) and whole and partial 16-key groups
        {1, 90, 400, 4, 64, 130, 2}, {1, 60, 200, 3, 32, 37, 2}, {1, 50, 120, 2, 48, 40, 2}, {1, 40, 100, 4, 16, 33, 2},
        // bf16 pair products (DI 32, 64) with one and two heads (the missing heads of a pair are 0)
        {1, 70, 160, 1, 64, 40, 2}, {1, 60, 150, 2, 32, 29, 1},
        // compressed keys (V4's CSA): rows with no visible entry, selections of all and of a few
        {2, 64, 16, 4, 64, 8, 0, 4}, {1, 130, 43, 3, 17, 40, 0, 3}, {1, 600, 150, 2, 32, 16, 0, 4},
        // a context-parallel chunk's queries from position P0 (with invalid slots in one)
        {2, 16, 16, 4, 64, 8, 0, 4, 48}, {1, 43, 40, 3, 17, 40, 0, 3, 77}, {1, 150, 300, 2, 32, 16, 0, 4, 1050},
        {2, 20, 30, 3, 16, 8, 1, 4, 100}},
       [](const OpInput& in) {
         IndexerCase c(in);
         return in.dtype == DType::f32 ? run_loss<float>(c) : run_loss<bf16>(c);
       }},
      {"hadamard_transform", {"rows", "n"},
       // rows, n
       {{1, 1}, {3, 2}, {5, 64}, {7, 128}, {2, 1024}},
       [](const OpInput& in) { return in.dtype == DType::f32 ? run_hadamard<float>(in) : run_hadamard<bf16>(in); }},
  };
}
