#include "titan/core/profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace titan {
namespace {

struct Entry {
  double seconds = 0;
  int64_t calls = 0;
};

struct Profile {
  std::mutex mu;
  std::map<std::string, Entry> entries;
  bool enabled = [] {
    const char* e = std::getenv("TITAN_PROFILE");
    return e && std::string(e) == "1";
  }();
  ~Profile() {
    if (enabled && !entries.empty()) std::fputs(profile_report().c_str(), stderr);
  }
};

Profile& profile() {
  static Profile p;
  return p;
}

}  // namespace

bool profiling_enabled() { return profile().enabled; }

void profile_add(const char* name, double seconds) {
  Profile& p = profile();
  std::lock_guard lock(p.mu);
  Entry& e = p.entries[name];
  e.seconds += seconds;
  ++e.calls;
}

std::string profile_report() {
  Profile& p = profile();
  std::vector<std::pair<std::string, Entry>> rows;
  double total = 0;
  {
    std::lock_guard lock(p.mu);
    rows.assign(p.entries.begin(), p.entries.end());
  }
  for (const auto& r : rows) total += r.second.seconds;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::string out = "profile (TITAN_PROFILE=1): region, total s, share, calls, ms/call\n";
  for (const auto& [name, e] : rows) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-28s %9.3f %6.1f%% %8lld %9.3f\n", name.c_str(), e.seconds,
                  total > 0 ? 100 * e.seconds / total : 0.0, static_cast<long long>(e.calls),
                  1e3 * e.seconds / double(std::max<int64_t>(e.calls, 1)));
    out += line;
  }
  return out;
}

}  // namespace titan
