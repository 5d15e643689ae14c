// The peak FLOP/s that MFU is measured against, stable from run to run: the best this machine ever
// measured (per CPU model and thread count), kept in a small cache file. One measurement at a
// run's start can come out low (a neighbour on the host, cores still ramping up: a report saw half
// of `titan info`'s figure and MFU above 100%), and no measurement can come out above the true
// peak, so the best one is the honest denominator.
#pragma once

#include <filesystem>
#include <string>

#include "titan/kernels/peak.h"

namespace titan::train {

struct StablePeak {
  kernels::MachinePeak peak;      // the best known: this measurement's or the cache's
  kernels::MachinePeak measured;  // this process's own measurement
  std::filesystem::path cache;    // where the best is kept ("" when it could not be written)
  std::string describe(bool bf16) const;  // one line: the figure and how it was found
};

// Measures (about `seconds` per kernel) and merges with the cache: each figure the larger of the
// two, written back. The cache is $TITAN_CACHE_DIR, else $XDG_CACHE_HOME/titan, else
// ~/.cache/titan: machine_peak.json, keyed by CPU (vendor, family, model, stepping, name), the
// kernels' ISA level and the thread count. A cache that cannot be read or written is skipped.
StablePeak stable_machine_peak(double seconds);

}  // namespace titan::train
