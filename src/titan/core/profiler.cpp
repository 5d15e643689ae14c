#include "titan/core/profiler.h"

#include "titan/core/allocator.h"
#include "titan/core/trace.h"

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

namespace {
thread_local const char* g_scope = nullptr;
}  // namespace

bool scopes_enabled() { return profiling_enabled() || tracing() || memory_sites_enabled(); }

const char* current_scope() { return g_scope ? g_scope : ""; }

ProfileScope::ProfileScope(const char* name) : name_(scopes_enabled() ? name : nullptr) {
  if (!name_) return;
  outer_ = g_scope;
  g_scope = name_;
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() {
  if (!name_) return;
  g_scope = outer_;
  const auto end = std::chrono::steady_clock::now();
  if (profiling_enabled()) profile_add(name_, std::chrono::duration<double>(end - start_).count());
  if (tracing()) {
    const std::string_view n = name_;
    const std::string_view category = n.ends_with(".bwd") ? "backward" : n.ends_with(".fwd") ? "forward" : "step";
    trace_span(n, category, std::chrono::duration<double>(start_.time_since_epoch()).count(),
               std::chrono::duration<double>(end.time_since_epoch()).count());
  }
}

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
