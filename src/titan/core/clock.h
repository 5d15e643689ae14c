// Seconds on the steady clock: the one time base of step timings, pipeline action costs, trace
// spans, collective deadlines and the flight recorder (only differences between two readings mean
// anything).
#pragma once

#include <chrono>

namespace titan {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace titan
