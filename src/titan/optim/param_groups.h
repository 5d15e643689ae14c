// Which parameters Muon trains and which AdamW does ([optimizer] name = "Muon"), by what each
// parameter declares (../shared/reference/v4.md 1.3-1.4: Keller's and Moonlight's rule, and
// DeepSeek-V4's split):
//   Muon   the hidden matrices: every 2-D weight (attention and FFN projections, MLA's, the
//          DSA indexer's, MTP's, the MoE router: a matrix, so Muon by the rule, as V4 leaves
//          it open) and routed experts [E, rows, cols], each expert its own matrix;
//   AdamW  the matrices indexed by the vocabulary (Parameter::vocabulary: the token embedding
//          and the output head, 2-D though they are), 2-D biases (Parameter::bias_table: V4's
//          compressor position bias), and every parameter of another rank (norm gains, biases,
//          scalar gates, V4's attention sinks and mHC's base and scale; a 3-D tensor that is not
//          a stack of experts). mHC's fn projections are matrices, Muon's, as V4 has them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "titan/nn/module.h"

namespace titan::optim {

enum class ParamGroup { muon, adamw };

ParamGroup muon_param_group(const nn::Parameter& p);

// A model's trainable parameters (the optimizer's: whole, or this rank's pieces) split by
// muon_param_group of the model's parameter of the same name, each group in the given order.
struct MuonParamGroups {
  std::vector<nn::TrainableParam> muon, adamw;
};
MuonParamGroups split_muon_groups(std::vector<nn::TrainableParam> params,
                                  const std::vector<std::pair<std::string, nn::Parameter*>>& named);

// Two indented lines for the start of a run: each group's tensor count, elements and a few names.
std::string describe_muon_groups(const MuonParamGroups& groups);

}  // namespace titan::optim
