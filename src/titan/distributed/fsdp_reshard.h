// When FSDP frees a unit's gathered parameters after its forward ([parallelism]
// fsdp_reshard_after_forward): freeing saves memory, keeping them saves gathering them again for
// the unit's backward.
#pragma once

#include <array>
#include <span>

#include "titan/core/enum_names.h"

namespace titan::distributed {

enum class ReshardAfterForward {
  per_unit,  // "default": each unit's own choice (ShardingUnit::reshard_after_forward: all but the output head)
  always,    // every unit
  never,     // no unit (ZeRO-2)
};

inline constexpr std::array<EnumName<ReshardAfterForward>, 3> kReshardAfterForwardNames = {{
    {ReshardAfterForward::per_unit, "default"},
    {ReshardAfterForward::always, "always"},
    {ReshardAfterForward::never, "never"},
}};
constexpr std::span<const EnumName<ReshardAfterForward>> enum_names(ReshardAfterForward) {
  return kReshardAfterForwardNames;
}

}  // namespace titan::distributed
