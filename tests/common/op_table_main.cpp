// Runs every registered op case: each shape x dtype x ISA level, fast vs reference.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/op_table.h"

namespace titan::test {

std::vector<OpCase>& op_registry() {
  static std::vector<OpCase> cases;
  return cases;
}

namespace {

// The row as ggml's vars() name it: softmax_forward(N=3, D=33, dtype=bf16, isa=avx2, seed=5).
std::string row_label(const OpCase& c, const OpInput& in, CpuCapability isa) {
  std::string s = c.name + "(";
  for (size_t i = 0; i < in.dims.size(); ++i) s += c.dim_names[i] + "=" + std::to_string(in.dims[i]) + ", ";
  return s + "dtype=" + std::string(dtype_name(in.dtype)) + ", isa=" + isa_label(isa) + ", seed=" +
         std::to_string(in.seed) + ")";
}

class OpTable : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTable, FastMatchesReference) {
  const OpCase& c = op_registry()[GetParam()];
  for (const auto& dims : c.shapes)
    ASSERT_LE(dims.size(), c.dim_names.size()) << c.name << ": a shape row has entries that dim_names does not name";
  uint64_t seed = 1;
  for (DType dt : c.dtypes) {
    for (const auto& dims : c.shapes) {
      for_each_isa([&](CpuCapability isa) {
        const OpInput in{dims, dt, seed++};
        for (const OpOutput& o : c.run(in)) {
          const std::string row = row_label(c, in, isa) + " output " + o.name;
          const bool low = o.ref.dtype() == DType::bf16 || dt == DType::bf16;
          const double atol = o.atol >= 0 ? o.atol : (low ? 2e-2 : 1e-5);
          const double rtol = o.rtol >= 0 ? o.rtol : (low ? 2e-2 : 1e-4);
          ASSERT_EQ(o.fast.shape(), o.ref.shape()) << row;
          const std::vector<double> got = to_doubles(o.fast), want = to_doubles(o.ref);
          const ErrorStats e = compare(got, want, atol, rtol);
          EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1.0) << row << ": " << error_report(e, got, want);
          EXPECT_TRUE(o.reference_nan || e.want_nan == 0)
              << row << ": the reference wrote " << e.want_nan << " NaNs (reference_nan: NaN is the defined result)";
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, OpTable, ::testing::Range(size_t(0), op_registry().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return op_registry()[p.param].name; });

}  // namespace
}  // namespace titan::test
