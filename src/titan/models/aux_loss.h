// The auxiliary losses a forward produces (MoE's balance loss, an indexer's KL, MTP's losses),
// returned up the call chain with its output instead of kept on the modules that made them: each
// module that has one appends it to the AuxLosses its caller passes (null: the caller wants none,
// e.g. evaluation).
#pragma once

#include <string>
#include <vector>

#include "titan/autograd/variable.h"

namespace titan::models {

struct AuxLoss {
  std::string name;             // its metrics name, e.g. "indexer_loss"
  autograd::Variable weighted;  // [1]: what the training loss adds (already weighted)
  double value = 0;             // what the metrics report of it
  // The step's metric of a name: the mean of its terms' values, or their sum (false).
  bool averaged = true;
};

using AuxLosses = std::vector<AuxLoss>;

}  // namespace titan::models
