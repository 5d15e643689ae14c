// [optimizer] name = "Muon": Muon (muon.h) for the hidden matrices and AdamW (adamw.h) for the
// rest of the model (param_groups.h says which is which), stepped together at one scheduled
// learning rate: AdamW's group at lr, Muon's at lr x muon_lr_scale (optimizer.muon_lr / lr; 1
// when the Muon group takes AdamW's lr, as match_rms_adamw intends). The state is both
// optimizers' under their own names ("<param>.momentum_buffer"; "<param>.exp_avg", ...), with a
// Swap each in a file of its own (Muon's is the swap file's name + ".muon").
#pragma once

#include <optional>

#include "titan/kernels/adamw_params.h"
#include "titan/optim/adamw.h"
#include "titan/optim/muon.h"
#include "titan/optim/param_groups.h"

namespace titan::optim {

class MuonAdamW final : public Optimizer {
 public:
  // shard_group, tp_shard_group: the groups that split Muon's matrices (muon.h; null: none).
  MuonAdamW(MuonParamGroups groups, const MuonConfig& muon, double muon_lr_scale, const kernels::AdamWParams& adamw,
            const std::optional<Swap>& swap = std::nullopt, const distributed::ProcessGroup* shard_group = nullptr,
            const distributed::ProcessGroup* tp_shard_group = nullptr);
  void step(float lr, float grad_scale = 1.0f) override;
  std::string name() const override { return "Muon"; }
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  std::vector<std::pair<std::string, Shape>> state_shapes() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) override;
  SavedState state_for_save() const override { return joined(muon_.state_for_save(), adamw_.state_for_save()); }
  const Muon& muon() const { return muon_; }
  const AdamW& adamw() const { return adamw_; }

 private:
  static std::optional<Swap> muon_swap(const std::optional<Swap>& swap);
  Muon muon_;
  AdamW adamw_;
  double muon_lr_scale_;
};

}  // namespace titan::optim
