// Activation checkpointing per transformer block ([activation_checkpoint] mode): what a block
// keeps from its forward for its backward, and what it computes again.
#pragma once

#include <array>
#include <span>

#include "titan/core/enum_names.h"

namespace titan::models {

// full recomputes the whole block in backward; selective keeps its GEMM and attention outputs
// and recomputes only the cheap ops between them.
enum class Recompute { none, full, selective };

inline constexpr std::array<EnumName<Recompute>, 3> kRecomputeNames = {{
    {Recompute::none, "none"},
    {Recompute::full, "full"},
    {Recompute::selective, "selective"},
}};
constexpr std::span<const EnumName<Recompute>> enum_names(Recompute) { return kRecomputeNames; }

}  // namespace titan::models
