// The sparse MLA reference backward (P recomputed from lse, Delta = rowsum(dO * O), the key and
// value roles of each latent row summed into dkv) against double-precision central differences
// of its forward, w.r.t. q and kv. Scale 0.5 as in FlashMLA's tests, so the key-role part of
// dkv is not tiny next to the value-role part.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "common/sparse_mla_inputs.h"
#include "titan/kernels/ref/sparse_mla.h"

using namespace titan;
using namespace titan::test;
using kernels::SparseMlaParams;

namespace {

void check_gradients(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Dqk, int64_t Dv, int64_t K,
                     SparseIdxOptions opt, const std::string& name) {
  SparseMlaParams d;
  d.B = B, d.S = S, d.Skv = Skv, d.H = H, d.Dqk = Dqk, d.Dv = Dv, d.K = K, d.scale = 0.5;
  const Tensor idx = random_sparse_idx(B, S, Skv, K, 11, name + ".idx", opt);
  const int32_t* sel = idx.data<int32_t>();
  const size_t o_n = size_t(B * S * H * Dv), lse_n = size_t(B * S * H);
  auto forward = [d, sel, o_n, lse_n](const std::vector<Doubles>& x) {
    Doubles o(o_n), lse(lse_n);
    kernels::ref::sparse_mla_forward<double>(o.data(), lse.data(), nullptr, x[0].data(), x[1].data(), sel, d);
    return std::vector<Doubles>{o};
  };
  auto backward = [d, sel, o_n, lse_n](const std::vector<Doubles>& x, const std::vector<Doubles>& dout) {
    Doubles o(o_n), lse(lse_n);
    kernels::ref::sparse_mla_forward<double>(o.data(), lse.data(), nullptr, x[0].data(), x[1].data(), sel, d);
    Doubles dq(x[0].size()), dkv(x[1].size());
    kernels::ref::sparse_mla_backward<double>(dq.data(), dkv.data(), dout[0].data(), x[0].data(), x[1].data(), sel,
                                              o.data(), lse.data(), d);
    return std::vector<Doubles>{dq, dkv};
  };
  gradcheck(name,
            {random_doubles(size_t(B * S * H * Dqk), 11, name + ".q", -2, 2),
             random_doubles(size_t(B * Skv * Dqk), 11, name + ".kv", -2, 2)},
            forward, backward);
}

}  // namespace

TEST(SparseMlaReference, GradientsMatchCentralDifferences) {
  check_gradients(1, 1, 1, 1, 3, 2, 1, {}, "single_token");
  check_gradients(2, 6, 6, 3, 5, 4, 3, {}, "causal_topk");                      // K < valid keys for t >= 3
  check_gradients(1, 5, 8, 2, 7, 5, 10, {false, 0.2}, "padded_future_keys");  // Skv > S, invalid slots
  check_gradients(1, 4, 4, 3, 6, 6, 4, {true, 0.5}, "dv_equals_dqk");         // many -1 slots, maybe empty rows
}
