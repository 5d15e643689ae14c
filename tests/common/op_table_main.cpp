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

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(d[i]);
  }
  return s;
}

class OpTable : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTable, FastMatchesReference) {
  const OpCase& c = op_registry()[GetParam()];
  uint64_t seed = 1;
  for (DType dt : c.dtypes) {
    for (const auto& dims : c.shapes) {
      for_each_isa([&](CpuCapability isa) {
        const OpInput in{dims, dt, seed++};
        for (const OpOutput& o : c.run(in)) {
          const bool low = o.ref.dtype() == DType::bf16 || dt == DType::bf16;
          const double atol = o.atol >= 0 ? o.atol : (low ? 2e-2 : 1e-5);
          const double rtol = o.rtol >= 0 ? o.rtol : (low ? 2e-2 : 1e-4);
          ASSERT_EQ(o.fast.shape(), o.ref.shape()) << c.name << "." << o.name;
          const ErrorStats e = compare(to_doubles(o.fast), to_doubles(o.ref), atol, rtol);
          EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1.0)
              << c.name << "." << o.name << " dims=" << dims_str(dims) << " dtype=" << dtype_name(dt)
              << " isa=" << isa_label(isa) << ": max_abs=" << e.max_abs
              << " (x" << e.max_scaled << " of tolerance) at element " << e.worst << ", nonfinite=" << e.nonfinite;
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, OpTable, ::testing::Range(size_t(0), op_registry().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return op_registry()[p.param].name; });

}  // namespace
}  // namespace titan::test
