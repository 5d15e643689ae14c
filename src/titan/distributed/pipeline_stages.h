// Which transformer blocks each pipeline stage holds (TorchTitan's split, pipeline_parallel.py):
// the embedding counts as `first_stage_less_layers` blocks and the final norm + output + loss as
// `last_stage_less_layers`, so that the stages share n_layers + first + last "effective layers"
// evenly (the first eff % stages stages one more); stage 0 then holds the embedding, the last
// stage the head (and the MTP modules, for DeepSeek-V3).
#pragma once

#include <vector>

namespace titan::distributed::pp {

struct StageLayers {
  int begin = 0, end = 0;  // blocks [begin, end)
  bool embedding = false;  // stage 0
  bool head = false;       // the last stage: final norm, output, loss
};

// Throws, with the most stages that would work, when some stage would hold nothing (more stages
// than effective layers) or the less-layers counts are negative.
std::vector<StageLayers> split_stages(int n_layers, int stages, int first_stage_less_layers = 1,
                                      int last_stage_less_layers = 1);

}  // namespace titan::distributed::pp
