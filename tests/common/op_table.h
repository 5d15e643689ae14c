// The table-driven op test (ggml test-backend-ops style): every fast kernel is run against its
// reference twin on a list of shapes (with odd sizes and tails), in f32 and bf16, at every ISA
// level the CPU supports. Each kernel family adds its rows in tests/ops/<family>.cpp:
//
//   TITAN_OP_CASES(rmsnorm) {
//     return {{"rmsnorm_forward", {{1, 7}, {3, 129}, {5, 4096}}, [](const titan::test::OpInput& in) {
//               ... run fast and ref on tensors built from in.dims / in.dtype / in.seed ...
//               return titan::test::OpOutputs{{"y", y_fast, y_ref}, {"rstd", r_fast, r_ref}};
//             }}};
//   }
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/kernel_check.h"

namespace titan::test {

struct OpInput {
  std::vector<int64_t> dims;  // the row's shape parameters; each case documents their meaning
  DType dtype;                // activation dtype under test (f32 or bf16)
  uint64_t seed;
};

struct OpOutput {
  std::string name;
  Tensor fast, ref;
  double atol = -1, rtol = -1;  // -1: the dtype's default tolerance
};
using OpOutputs = std::vector<OpOutput>;

struct OpCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  std::function<OpOutputs(const OpInput&)> run;
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
};

std::vector<OpCase>& op_registry();

struct OpCaseRegistrar {
  explicit OpCaseRegistrar(std::vector<OpCase> (*make)()) {
    for (auto& c : make()) op_registry().push_back(std::move(c));
  }
};

}  // namespace titan::test

#define TITAN_OP_CASES(family)                                                          \
  static std::vector<::titan::test::OpCase> titan_op_cases_##family();                  \
  static ::titan::test::OpCaseRegistrar titan_op_registrar_##family(&titan_op_cases_##family); \
  static std::vector<::titan::test::OpCase> titan_op_cases_##family()
