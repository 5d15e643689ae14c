#include "titan/distributed/pipeline_stages.h"

#include <algorithm>
#include <string>

#include "titan/core/error.h"

namespace titan::distributed::pp {

std::vector<StageLayers> split_stages(int n_layers, int stages, int first_stage_less_layers, int last_stage_less_layers) {
  TITAN_CHECK(first_stage_less_layers >= 0 && last_stage_less_layers >= 0,
              "parallelism.pipeline_parallel_first_stage_less_layers / last_stage_less_layers must be >= 0, got " +
                  std::to_string(first_stage_less_layers) + " / " + std::to_string(last_stage_less_layers),
              "use 0 for a stage that holds as many blocks as the others, 1 (the default) to count the embedding "
              "or the head as a block");
  const int effective = n_layers + first_stage_less_layers + last_stage_less_layers;
  TITAN_CHECK(stages >= 1 && stages <= effective,
              std::to_string(stages) + " pipeline stages for a model of " + std::to_string(n_layers) +
                  " blocks (" + std::to_string(effective) + " effective layers with the embedding and the head): a "
                  "stage would hold nothing",
              "use at most " + std::to_string(effective) +
                  " stages (pipeline_parallel_degree x stages per rank), or lower the less-layers counts");
  std::vector<StageLayers> out(static_cast<size_t>(stages));
  int at = -first_stage_less_layers;  // in effective layers; the embedding's share comes first
  for (int s = 0; s < stages; ++s) {
    const int share = effective / stages + (s < effective % stages ? 1 : 0);
    StageLayers& st = out[size_t(s)];
    st.begin = std::clamp(at, 0, n_layers);
    st.end = std::clamp(at + share, 0, n_layers);
    st.embedding = s == 0;
    st.head = s == stages - 1;
    at += share;
  }
  for (int s = 0; s < stages; ++s) {
    const StageLayers& st = out[size_t(s)];
    TITAN_CHECK(st.end > st.begin || st.embedding || st.head,
                "pipeline stage " + std::to_string(s) + " of " + std::to_string(stages) + " would hold no block of the " +
                    std::to_string(n_layers),
                "use at most " + std::to_string(n_layers) + " stages, or lower the less-layers counts");
  }
  return out;
}

}  // namespace titan::distributed::pp
