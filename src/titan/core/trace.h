// A trace of what a process does during some steps, for chrome://tracing and Perfetto: timed
// spans (an op's forward or backward, a collective, data loading, the optimizer, a checkpoint)
// on the thread that ran them. Off unless a trace is being recorded; the off path of a span is
// one relaxed atomic load (ProfileScope, core/profiler.h, records its regions here as well).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

struct TraceSpan {
  std::string name, category, args_json;  // args_json: "" or a JSON object's text
  double start = 0, end = 0;              // seconds on the steady clock
  int thread = 0;                         // the recording thread's index (trace_thread_names())
};

// Whether a trace is being recorded now.
bool tracing();
// Starts recording (dropping anything recorded before); trace_stop returns the spans.
void trace_start();
std::vector<TraceSpan> trace_stop();
// Records a finished span of the calling thread (a no-op unless tracing()).
void trace_span(std::string_view name, std::string_view category, double start, double end, std::string args_json = {});
// Names the calling thread in traces (e.g. "communication"); threads default to "thread <i>",
// the one that starts a trace to "main".
void trace_name_thread(const std::string& name);
// Seconds on the steady clock (the time base of spans).
double trace_clock();

// Writes spans as a Chrome trace JSON file (the folder is created): one process (pid, named
// process_name), one track per thread, times in microseconds from the first span.
void write_chrome_trace(const std::filesystem::path& file, const std::vector<TraceSpan>& spans, int pid,
                        const std::string& process_name);

}  // namespace titan
