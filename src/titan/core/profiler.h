// A minimal op profiler: wall time and call counts per named region, off unless TITAN_PROFILE=1
// (then the table prints at exit). While a trace records (core/trace.h) each region is also a
// span of it, and while allocations are attributed (allocator.h) the innermost region names
// the site of each. The off path is a couple of relaxed loads per region.
#pragma once

#include <chrono>
#include <string>

namespace titan {

bool profiling_enabled();
void profile_add(const char* name, double seconds);
std::string profile_report();  // a table sorted by total time

// Whether any ProfileScope consumer is on: the profile table, a trace or allocation sites.
bool scopes_enabled();
// The innermost ProfileScope of the calling thread ("" when none or scopes are off).
const char* current_scope();

class ProfileScope {
 public:
  explicit ProfileScope(const char* name);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  const char* outer_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace titan
