#include "titan/optim/param_groups.h"

#include <map>

#include "titan/core/error.h"

namespace titan::optim {

ParamGroup muon_param_group(const nn::Parameter& p) {
  if (p.vocabulary || p.bias_table) return ParamGroup::adamw;
  const size_t rank = p.var.shape().size();
  if (rank == 2 || (rank == 3 && p.routed_expert)) return ParamGroup::muon;
  return ParamGroup::adamw;
}

MuonParamGroups split_muon_groups(std::vector<nn::TrainableParam> params,
                                  const std::vector<std::pair<std::string, nn::Parameter*>>& named) {
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& [name, p] : named) by_name[name] = p;
  MuonParamGroups out;
  for (nn::TrainableParam& t : params) {
    const auto it = by_name.find(t.name);
    TITAN_CHECK(it != by_name.end(), "split_muon_groups: the optimizer's parameter '" + t.name +
                                         "' is not one of the model's named_parameters()");
    (muon_param_group(*it->second) == ParamGroup::muon ? out.muon : out.adamw).push_back(std::move(t));
  }
  return out;
}

std::string describe_muon_groups(const MuonParamGroups& groups) {
  auto line = [](const char* what, const std::vector<nn::TrainableParam>& ps) {
    int64_t elems = 0;
    for (const nn::TrainableParam& p : ps) elems += p.var.value().numel();
    std::string names;
    for (size_t i = 0; i < ps.size() && i < 4; ++i) names += (i ? ", " : "") + ps[i].name;
    if (ps.size() > 4) names += ", ...";
    return std::string(what) + std::to_string(ps.size()) + " tensors, " + std::to_string(elems) + " elements" +
           (names.empty() ? "" : " (" + names + ")");
  };
  return line("  Muon:  ", groups.muon) + "\n" + line("  AdamW: ", groups.adamw);
}

}  // namespace titan::optim
