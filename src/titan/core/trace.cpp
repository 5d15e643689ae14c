#include "titan/core/clock.h"
#include "titan/core/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"

namespace titan {

namespace {

struct Tracer {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<TraceSpan> spans;
  std::vector<std::string> thread_names;
};

Tracer& tracer() {
  static Tracer* t = new Tracer();  // never destroyed: threads may record during static destruction
  return *t;
}

// This thread's index in the tracer's name table (assigned on first use).
int thread_index() {
  thread_local int index = -1;
  if (index < 0) {
    Tracer& t = tracer();
    std::lock_guard lock(t.mu);
    index = int(t.thread_names.size());
    t.thread_names.push_back("thread " + std::to_string(index));
  }
  return index;
}

}  // namespace

bool tracing() { return tracer().on.load(std::memory_order_relaxed); }

double trace_clock() { return steady_seconds(); }

void trace_start() {
  Tracer& t = tracer();
  const int index = thread_index();
  std::lock_guard lock(t.mu);
  if (t.thread_names[size_t(index)].starts_with("thread ")) t.thread_names[size_t(index)] = "main";  // the one that traces
  t.spans.clear();
  t.on.store(true);
}

std::vector<TraceSpan> trace_stop() {
  Tracer& t = tracer();
  std::lock_guard lock(t.mu);
  t.on.store(false);
  return std::move(t.spans);
}

void trace_span(std::string_view name, std::string_view category, double start, double end, std::string args_json) {
  if (!tracing()) return;
  const int thread = thread_index();
  Tracer& t = tracer();
  std::lock_guard lock(t.mu);
  if (!t.on.load()) return;
  t.spans.push_back({std::string(name), std::string(category), std::move(args_json), start, end, thread});
}

void trace_name_thread(const std::string& name) {
  const int index = thread_index();
  Tracer& t = tracer();
  std::lock_guard lock(t.mu);
  t.thread_names[size_t(index)] = name;
}

void write_chrome_trace(const std::filesystem::path& file, const std::vector<TraceSpan>& spans, int pid,
                        const std::string& process_name) {
  using nlohmann::json;
  double origin = spans.empty() ? 0 : spans.front().start;
  for (const TraceSpan& s : spans) origin = std::min(origin, s.start);
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process_name}}}});
  std::vector<std::string> names;
  {
    Tracer& t = tracer();
    std::lock_guard lock(t.mu);
    names = t.thread_names;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", i}, {"args", {{"name", names[i]}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", i}, {"args", {{"sort_index", i}}}});
  }
  for (const TraceSpan& s : spans) {
    json e = {{"name", s.name}, {"cat", s.category}, {"ph", "X"}, {"pid", pid}, {"tid", s.thread},
              {"ts", (s.start - origin) * 1e6}, {"dur", std::max(0.0, s.end - s.start) * 1e6}};
    if (!s.args_json.empty()) e["args"] = json::parse(s.args_json, nullptr, false);
    events.push_back(std::move(e));
  }
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  std::ofstream out(file);
  out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  TITAN_CHECK(out.good(), "cannot write the trace " + file.string(), "check that job.dump_folder is writable");
}

}  // namespace titan
