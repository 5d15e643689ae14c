// The sum of a sequence of f32 tensors (one per micro-batch), combined as a binary tree in the
// order they arrive: ((x0 + x1) + (x2 + x3)) for four, a left-heavy tree otherwise. It is the
// tree the reductions over ranks use (process_group.h), so gradients summed over micro-batches
// here and over ranks there form one tree: with power-of-two rank counts, any data-parallel
// layout and accumulation gives the same bits as one rank. (The ranks' tree is fold_in_place in
// comm_engine.cpp: the two must stay the same tree.)
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::distributed {

class TreeSum {
 public:
  // Adds x (its values may be overwritten: the sum keeps partial sums in the tensors given).
  void add(const Tensor& x);
  bool empty() const { return partial_.empty(); }
  // The sum of everything added since the last call, which empties the sum.
  Tensor take();

 private:
  std::vector<std::pair<int64_t, Tensor>> partial_;  // (leaves, their sum), leaves decreasing
};

}  // namespace titan::distributed
