// Runs a Tensor-level kernel call under both kernel backends (fast and reference) so op-table
// rows exercise the public API (its checks and dispatch) as well as the kernels.
#pragma once

#include <string>
#include <vector>

#include "common/op_table.h"
#include "titan/kernels/dispatch.h"

namespace titan::test {

// run() allocates and returns the outputs (any accumulated-into gradients included) from one
// call; it is called once per backend with the same inputs. Output k is named names[k].
template <class Run>
OpOutputs fast_vs_reference(const std::vector<std::string>& names, Run&& run) {
  const kernels::KernelBackend saved = kernels::kernel_backend();
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const std::vector<Tensor> fast = run();
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  const std::vector<Tensor> ref = run();
  kernels::set_kernel_backend(saved);
  OpOutputs out;
  for (size_t k = 0; k < names.size(); ++k) out.push_back({names[k], fast.at(k), ref.at(k)});
  return out;
}

// f() run under the reference backend (then back to the one before): what a fast kernel's result
// must equal.
template <class F>
auto on_reference(F&& f) {
  const kernels::KernelBackend saved = kernels::kernel_backend();
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  auto out = f();
  kernels::set_kernel_backend(saved);
  return out;
}

}  // namespace titan::test
