// Traces (core/trace.h) and memory snapshots (core/allocator.h): what they record, that nothing is
// recorded while they are off, and the Chrome trace file's structure.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "titan/core/allocator.h"
#include "titan/core/profiler.h"
#include "titan/core/tensor.h"
#include "titan/core/trace.h"

using namespace titan;
namespace fs = std::filesystem;

TEST(Trace, RecordsScopesAndSpansOnlyWhileOn) {
  { ProfileScope off("before.fwd"); }
  trace_start();
  {
    ProfileScope outer("step region");
    ProfileScope inner("linear.fwd");
  }
  { ProfileScope bwd("linear.bwd"); }
  std::thread other([] {
    trace_name_thread("worker");
    trace_span("all_gather fsdp", "collective", trace_clock(), trace_clock() + 1e-3, R"({"bytes_sent": 8})");
  });
  other.join();
  const std::vector<TraceSpan> spans = trace_stop();
  { ProfileScope after("after.fwd"); }
  EXPECT_TRUE(trace_stop().empty()) << "nothing is recorded once stopped";
  ASSERT_EQ(spans.size(), 4u);
  auto find = [&](const std::string& name) {
    return *std::find_if(spans.begin(), spans.end(), [&](const TraceSpan& s) { return s.name == name; });
  };
  EXPECT_EQ(find("linear.fwd").category, "forward");
  EXPECT_EQ(find("linear.bwd").category, "backward");
  EXPECT_EQ(find("step region").category, "step");
  EXPECT_EQ(find("all_gather fsdp").category, "collective");
  // Nested: the inner span lies within the outer.
  EXPECT_LE(find("step region").start, find("linear.fwd").start);
  EXPECT_GE(find("step region").end, find("linear.fwd").end);
  EXPECT_NE(find("all_gather fsdp").thread, find("linear.fwd").thread);

  const fs::path file = fs::temp_directory_path() / ("titan_trace_" + std::to_string(::getpid())) / "rank3_trace.json";
  write_chrome_trace(file, spans, 3, "rank 3");
  const auto j = nlohmann::json::parse(std::ifstream(file));
  int complete = 0, names = 0;
  bool worker = false, main = false;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_GE(e["ts"].get<double>(), 0);
      EXPECT_GE(e["dur"].get<double>(), 0);
      if (e["name"] == "all_gather fsdp") EXPECT_EQ(e["args"]["bytes_sent"], 8);
    }
    if (e["name"] == "thread_name") {
      ++names;
      worker |= e["args"]["name"] == "worker";
      main |= e["args"]["name"] == "main";
    }
  }
  EXPECT_EQ(complete, 4);
  EXPECT_GE(names, 2);
  EXPECT_TRUE(worker && main);
  fs::remove_all(file.parent_path());
}

TEST(MemorySnapshot, HoldsTheBlocksLiveAtThePeakWithTheirSites) {
  memory_track_blocks(true);
  Tensor kept;
  {
    ProfileScope site("model build");
    kept = Tensor::zeros({1000}, DType::f32, MemCategory::parameters);
  }
  memory_snapshot_start();
  {
    ProfileScope site("attention.fwd");
    Tensor big = Tensor::empty({50000}, DType::f32, MemCategory::activations);  // the peak: kept + big
  }
  Tensor small = Tensor::empty({100}, DType::f32, MemCategory::temporaries);  // after the peak
  const MemorySnapshot snap = memory_snapshot_take();
  memory_track_blocks(false);
  ASSERT_GE(snap.blocks.size(), 2u);
  EXPECT_EQ(snap.blocks[0].bytes, 50000 * 4);
  EXPECT_EQ(snap.blocks[0].site, "attention.fwd");
  EXPECT_EQ(snap.blocks[0].category, MemCategory::activations);
  const auto kept_block = std::find_if(snap.blocks.begin(), snap.blocks.end(), [](const MemoryBlock& b) { return b.site == "model build"; });
  ASSERT_NE(kept_block, snap.blocks.end());
  EXPECT_EQ(kept_block->bytes, (4000 + 63) / 64 * 64);  // blocks are whole 64-byte lines
  for (const MemoryBlock& b : snap.blocks) EXPECT_NE(b.category, MemCategory::temporaries) << "freed before or allocated after the peak";
  int64_t total = 0;
  for (const MemoryBlock& b : snap.blocks) total += b.bytes;
  EXPECT_EQ(total, snap.peak_total);
}
