// Gradient check of the RoPE reference twin in double: backward (rotation by -theta) against
// central differences of forward, for both layouts and partial rotation.
#include "common/gradcheck.h"
#include "common/kernel_check.h"
#include "titan/kernels/ref/rope.h"
#include "titan/kernels/rope.h"

using namespace titan;
using namespace titan::test;
using namespace titan::kernels;

namespace {

void check(RopeLayout layout, int64_t heads, int64_t head_dim, int64_t rope_dims, int64_t offset, RopeScaling scaling) {
  RopeConfig cfg;
  cfg.rope_dims = rope_dims;
  cfg.scaling = scaling;
  cfg.factor = 8;
  cfg.original_max_position_embeddings = 16;
  cfg.mscale = 0.8;  // a table magnitude != 1 under yarn, so the check sees it
  const RopeTables t = rope_tables(cfg, 50);
  const Doubles cos = to_doubles(t.cos), sin = to_doubles(t.sin);
  const std::vector<int32_t> positions = {0, 49, 7, 7};  // repeats and the last row
  const RopeParams s{int64_t(positions.size()), heads, head_dim, offset, rope_dims, layout};
  const size_t n = size_t(s.tokens * heads * head_dim);
  gradcheck(
      "rope", {random_doubles(n, 1, "x")},
      [&](const std::vector<Doubles>& in) {
        Doubles y(n);
        ref::rope_forward<double>(y.data(), in[0].data(), cos.data(), sin.data(), positions.data(), s);
        return std::vector<Doubles>{y};
      },
      [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
        Doubles dx(n, 0.0);
        ref::rope_backward<double>(dx.data(), dout[0].data(), cos.data(), sin.data(), positions.data(), s);
        return std::vector<Doubles>{dx};
      });
}

}  // namespace

TEST(RopeGradcheck, Interleaved) { check(RopeLayout::interleaved, 2, 8, 8, 0, RopeScaling::none); }
TEST(RopeGradcheck, RotateHalf) { check(RopeLayout::rotate_half, 2, 8, 8, 0, RopeScaling::llama3); }
TEST(RopeGradcheck, PartialInterleavedYarn) { check(RopeLayout::interleaved, 3, 10, 4, 6, RopeScaling::yarn); }
TEST(RopeGradcheck, PartialRotateHalfYarn) { check(RopeLayout::rotate_half, 1, 11, 6, 2, RopeScaling::yarn); }
