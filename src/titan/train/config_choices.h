// The closed choices of the job config that belong to the training loop itself: each an enum
// class (so that code switches on it and the compiler checks every case) with the table of the
// names the TOML and the command line spell it with (core/enum_names.h). Choices that name a
// lower layer's concept live with it: optim::LrDecay, models::Recompute, pp::ScheduleKind,
// distributed::ReshardAfterForward, and DType (by PyTorch's names, core/dtype_torch_names.h).
#pragma once

#include <array>
#include <span>

#include "titan/core/enum_names.h"

namespace titan::train {

// [optimizer] name: AdamW over every parameter, or Muon for the hidden matrices with AdamW for the
// rest (optim/muon_adamw.h). The names are what checkpoints record (optim::Optimizer::name).
enum class OptimizerKind { adamw, muon };
inline constexpr std::array<EnumName<OptimizerKind>, 2> kOptimizerKindNames = {{
    {OptimizerKind::adamw, "AdamW"},
    {OptimizerKind::muon, "Muon"},
}};
constexpr std::span<const EnumName<OptimizerKind>> enum_names(OptimizerKind) { return kOptimizerKindNames; }

// [optimizer] swap: where the optimizer's moments live between steps.
enum class OptimizerSwap { none, file };
inline constexpr std::array<EnumName<OptimizerSwap>, 2> kOptimizerSwapNames = {{
    {OptimizerSwap::none, "none"},
    {OptimizerSwap::file, "file"},
}};
constexpr std::span<const EnumName<OptimizerSwap>> enum_names(OptimizerSwap) { return kOptimizerSwapNames; }

// [parallelism] moe_tp_scheme: sequence (torchtitan-npu's MoE TP fix) or gather (TorchTitan's).
enum class MoeTpScheme { sequence, gather };
inline constexpr std::array<EnumName<MoeTpScheme>, 2> kMoeTpSchemeNames = {{
    {MoeTpScheme::sequence, "sequence"},
    {MoeTpScheme::gather, "gather"},
}};
constexpr std::span<const EnumName<MoeTpScheme>> enum_names(MoeTpScheme) { return kMoeTpSchemeNames; }

// [parallelism] pipeline_parallel_gradient_sum (train/pipeline_step.h).
enum class GradientSum { in_place, tree };
inline constexpr std::array<EnumName<GradientSum>, 2> kGradientSumNames = {{
    {GradientSum::in_place, "in_place"},
    {GradientSum::tree, "tree"},
}};
constexpr std::span<const EnumName<GradientSum>> enum_names(GradientSum) { return kGradientSumNames; }

// [parallelism] pipeline_parallel_fsdp (distributed/fsdp.h's FsdpOptions::pipeline_per_step).
enum class PipelineFsdp { zero3, per_step };
inline constexpr std::array<EnumName<PipelineFsdp>, 2> kPipelineFsdpNames = {{
    {PipelineFsdp::zero3, "zero3"},
    {PipelineFsdp::per_step, "per_step"},
}};
constexpr std::span<const EnumName<PipelineFsdp>> enum_names(PipelineFsdp) { return kPipelineFsdpNames; }

// [checkpoint] async_mode: whether training waits while a checkpoint is written.
enum class CheckpointAsyncMode { disabled, async };
inline constexpr std::array<EnumName<CheckpointAsyncMode>, 2> kCheckpointAsyncModeNames = {{
    {CheckpointAsyncMode::disabled, "disabled"},
    {CheckpointAsyncMode::async, "async"},
}};
constexpr std::span<const EnumName<CheckpointAsyncMode>> enum_names(CheckpointAsyncMode) {
  return kCheckpointAsyncModeNames;
}

// [fault] on_nonfinite: what a non-finite loss or gradient norm does.
enum class NonFinitePolicy { abort, skip, rollback };
inline constexpr std::array<EnumName<NonFinitePolicy>, 3> kNonFinitePolicyNames = {{
    {NonFinitePolicy::abort, "abort"},
    {NonFinitePolicy::skip, "skip"},
    {NonFinitePolicy::rollback, "rollback"},
}};
constexpr std::span<const EnumName<NonFinitePolicy>> enum_names(NonFinitePolicy) { return kNonFinitePolicyNames; }

// [training] loss_scaling: dynamic loss scaling (PyTorch's GradScaler). auto: dynamic under
// mixed_precision_param = "float16", none otherwise.
enum class LossScaling { auto_, dynamic, none };
inline constexpr std::array<EnumName<LossScaling>, 3> kLossScalingNames = {{
    {LossScaling::auto_, "auto"},
    {LossScaling::dynamic, "dynamic"},
    {LossScaling::none, "none"},
}};
constexpr std::span<const EnumName<LossScaling>> enum_names(LossScaling) { return kLossScalingNames; }

}  // namespace titan::train
