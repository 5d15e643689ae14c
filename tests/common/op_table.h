// The table-driven op test (ggml test-backend-ops style): every fast kernel is run against its
// reference twin on a list of shapes (with odd sizes and tails), in f32 and bf16, at every ISA
// level the CPU supports. Each kernel family adds its rows in tests/ops/<family>.cpp:
//
//   TITAN_OP_CASES(rmsnorm) {
//     return {{"rmsnorm_forward", {"N", "D"}, {{1, 7}, {3, 129}, {5, 4096}}, [](const titan::test::OpInput& in) {
//               ... run fast and ref on tensors built from in.dims / in.dtype / in.seed ...
//               return titan::test::OpOutputs{{"y", y_fast, y_ref}, {"rstd", r_fast, r_ref}};
//             }}};
//   }
//
// A failure names the row as ggml's vars() do, e.g. rmsnorm_forward(N=3, D=129, dtype=bf16,
// isa=avx512_bf16+amx, seed=9), and gives max abs / rel error and NMSE. Non-finite values must
// match exactly (kernel_check.h compare), and a NaN in the reference fails the row unless the
// output declares NaN a defined result (reference_nan).
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
  bool reference_nan = false;    // NaN is a defined result here (e.g. of NaN inputs); else a reference NaN fails
};
using OpOutputs = std::vector<OpOutput>;

struct OpCase {
  std::string name;
  std::vector<std::string> dim_names;         // what each entry of a shape row is, e.g. {"N", "D"}
  std::vector<std::vector<int64_t>> shapes;  // rows may leave out trailing (optional) entries
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
