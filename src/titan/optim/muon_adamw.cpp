#include "titan/optim/muon_adamw.h"

#include <utility>

namespace titan::optim {

std::optional<Swap> MuonAdamW::muon_swap(const std::optional<Swap>& swap) {
  if (!swap) return std::nullopt;
  return Swap{swap->file + ".muon", swap->chunk_bytes};
}

MuonAdamW::MuonAdamW(MuonParamGroups groups, const MuonConfig& muon, double muon_lr_scale,
                     const kernels::AdamWParams& adamw, const std::optional<Swap>& swap,
                     const distributed::ProcessGroup* shard_group, const distributed::ProcessGroup* tp_shard_group)
    : muon_(std::move(groups.muon), muon, muon_swap(swap), shard_group, tp_shard_group),
      adamw_(std::move(groups.adamw), adamw, swap),
      muon_lr_scale_(muon_lr_scale) {}

void MuonAdamW::step(float lr, float grad_scale) {
  muon_.step(float(double(lr) * muon_lr_scale_), grad_scale);
  adamw_.step(lr, grad_scale);
}

std::vector<std::pair<std::string, Tensor>> MuonAdamW::state_dict() const {
  auto out = muon_.state_dict();
  for (auto& entry : adamw_.state_dict()) out.push_back(std::move(entry));
  return out;
}

std::vector<std::pair<std::string, Shape>> MuonAdamW::state_shapes() const {
  auto out = muon_.state_shapes();
  for (auto& entry : adamw_.state_shapes()) out.push_back(std::move(entry));
  return out;
}

void MuonAdamW::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  muon_.check_state_dict(state, source);  // AdamW checks its own before changing anything
  adamw_.load_state_dict(state, source);
  muon_.load_state_dict(state, source);
}

}  // namespace titan::optim
