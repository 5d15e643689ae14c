// Pieces every decoder model family shares.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "titan/autograd/variable.h"
#include "titan/models/causal_lm.h"
#include "titan/nn/module.h"

namespace titan::models {

// Throws unless every position (i32) indexes the model's RoPE table of `table_rows` rows.
void check_rope_positions(const std::string& model, const Tensor& positions, int64_t table_rows);

// i32 [batch, seq]: start, start + 1, ... in every row.
Tensor default_positions(int64_t batch, int64_t seq, int64_t start = 0);

// Whether the pipeline stages a rank holds (the whole model when there are none) include a part
// (ModelOptions::pipeline_stages): part(stage) says whether that stage needs it.
template <class Part>
bool holds(const std::vector<distributed::pp::StageLayers>& stages, const Part& part) {
  if (stages.empty()) return true;
  for (const distributed::pp::StageLayers& st : stages)
    if (part(st)) return true;
  return false;
}

// A family's model as its parallel plan places it: make() builds it with every parameter
// declared whole and without memory, its constructor places them (tensor and expert parallel
// pieces), then only this rank's pieces get memory. Under an outer ParametersWithoutStorage (the
// memory planner) none does.
template <class Make>
auto build_placed(const Make& make) {
  decltype(make()) model;
  {
    nn::ParametersWithoutStorage declared;
    model = make();
  }
  model->materialize_parameters();
  return model;
}

// The checkpoint policy of a recompute mode other than none.
inline autograd::CheckpointPolicy checkpoint_policy(Recompute r) {
  return r == Recompute::selective ? autograd::CheckpointPolicy::save_expensive
                                   : autograd::CheckpointPolicy::recompute_all;
}

// h = f(block, h) for each block in order; under Recompute::full / selective each block is one
// activation checkpoint region (its inner activations, all or the cheap ones, are recomputed in
// backward instead of kept).
// Only the blocks whose index is in [begin, end) run (a pipeline stage's).
template <class Block>
autograd::Variable run_blocks(nn::ModuleList<Block>& blocks, autograd::Variable h, Recompute recompute,
                              const std::function<autograd::Variable(Block&, const autograd::Variable&)>& f,
                              int begin = 0, int end = std::numeric_limits<int>::max()) {
  for (size_t l = 0; l < blocks.size(); ++l) {
    if (const auto index = int64_t(blocks.index(l)); index < begin || index >= end) continue;
    Block& block = blocks[l];
    nn::UnitScope unit(block);  // each block is a unit of the parallel plan (outside its checkpoint region)
    if (recompute != Recompute::none) {
      h = autograd::checkpoint(
          [&block, f](const std::vector<autograd::Variable>& in) { return std::vector<autograd::Variable>{f(block, in[0])}; },
          {h}, checkpoint_policy(recompute))[0];
    } else {
      h = f(block, h);
    }
  }
  return h;
}

}  // namespace titan::models
