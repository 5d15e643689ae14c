// A minimal op profiler: wall time and call counts per named region, off unless TITAN_PROFILE=1
// (then the table prints at exit). The off path is one relaxed load per region.
#pragma once

#include <chrono>
#include <string>

namespace titan {

bool profiling_enabled();
void profile_add(const char* name, double seconds);
std::string profile_report();  // a table sorted by total time

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(profiling_enabled() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (name_) profile_add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace titan
