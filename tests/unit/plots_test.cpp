#include <gtest/gtest.h>

#include <cairo.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error_of.h"
#include "titan/core/error.h"
#include "titan/train/chart.h"
#include "titan/train/plots.h"

using namespace titan;
using namespace titan::train;
using titan::test::error_of;
namespace fs = std::filesystem;

namespace {

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("titan_plots_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A PNG read back: its size and how many pixels have the palette's first colour (the first
// series' line, the bars) and how many are not white.
struct Png {
  int width = 0, height = 0;
  int64_t blue = 0, inked = 0;
};

Png read_png(const fs::path& file) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(file.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << file;
  Png p;
  p.width = cairo_image_surface_get_width(s);
  p.height = cairo_image_surface_get_height(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  for (int y = 0; data && y < p.height; ++y)
    for (int x = 0; x < p.width; ++x) {
      const auto* px = reinterpret_cast<const uint32_t*>(data + y * stride) + x;
      const int r = (*px >> 16) & 255, g = (*px >> 8) & 255, b = *px & 255;
      if (std::abs(r - 31) < 12 && std::abs(g - 120) < 12 && std::abs(b - 181) < 12) ++p.blue;
      if (r < 250 || g < 250 || b < 250) ++p.inked;
    }
  cairo_surface_destroy(s);
  return p;
}

void write_metrics(const fs::path& file, bool moe) {
  std::ofstream f(file);
  for (int step = 1; step <= 20; ++step) {
    nlohmann::json j = {{"kind", "train"},          {"step", step},
                        {"loss", 8.0 / step},        {"grad_norm", 1.0 + 0.1 * step},
                        {"lr", 1e-3 * step / 20},    {"tokens_per_second", 1000 + 10 * step},
                        {"mfu", 0.3},                {"step_seconds", 0.5},
                        {"peak_memory_bytes", {{"params", 1 << 20}, {"activations", step << 20}, {"total", 40 << 20}}}};
    if (moe) {
      j["indexer_loss"] = 0.01 / step;
      for (int layer : {1, 2}) {
        j["moe_imbalance/layer" + std::to_string(layer)] = 1.0 + 0.01 * step * layer;
        j["moe_load_max/layer" + std::to_string(layer)] = 500 + step;
        j["moe_load_min/layer" + std::to_string(layer)] = 300 - step;
      }
    }
    f << j.dump() << "\n";
    if (step % 10 == 0) f << nlohmann::json{{"kind", "validation"}, {"step", step}, {"loss", 9.0 / step}}.dump() << "\n";
  }
  // A run resumed from step 18 logs 19 and 20 again (the later lines win), and one line was cut short.
  f << nlohmann::json{{"kind", "train"}, {"step", 19}, {"loss", 0.25}}.dump() << "\n";
  f << R"({"kind":"train","step":20,"lo)" << "\n";
}


}  // namespace

TEST(Charts, TicksAreRoundAndCoverTheRange) {
  const auto t = nice_ticks(0.13, 9.7);
  ASSERT_GE(t.size(), 3u);
  EXPECT_LE(t.front(), 0.13);
  EXPECT_GE(t.back(), 9.7);
  EXPECT_DOUBLE_EQ(t[1] - t[0], 2.0);
  const auto small = nice_ticks(2e-5, 1.2e-4);
  EXPECT_NEAR(small[1] - small[0], 2e-5, 1e-12);
  const auto steps = nice_ticks(1, 12);  // integer steps get integer ticks
  for (double v : steps) EXPECT_EQ(v, std::round(v));
  EXPECT_NE(error_of([] { nice_ticks(1, 1); }).find("nice_ticks"), std::string::npos);
}

TEST(Charts, LineChartDrawsEveryPanelWithItsSeries) {
  const fs::path dir = fresh_folder("lines");
  ChartPanel one{"one", "step", "value", {{"a", {1, 2, 3}, {1, 4, 9}, -1, false}}};
  ChartPanel empty{"none", "step", "value", {{"nan", {1, 2}, {NAN, NAN}, -1, false}}};
  draw_line_charts(dir / "a.png", "title", {one, empty});
  const Png p = read_png(dir / "a.png");
  EXPECT_EQ(p.width, 1100);
  EXPECT_EQ(p.height, 44 + 2 * 330);
  EXPECT_GT(p.blue, 200);  // the line and its markers
  draw_line_charts(dir / "b.png", "title", {empty});
  EXPECT_EQ(read_png(dir / "b.png").blue, 0);  // nothing to draw, nothing in the legend
  fs::remove_all(dir);
}

TEST(Plots, RunPlotsHoldEveryFigure) {
  const fs::path dir = fresh_folder("run");
  write_metrics(dir / "metrics.jsonl", /*moe=*/true);
  const auto written = write_run_plots(dir / "metrics.jsonl", dir / "plots");
  ASSERT_EQ(written.size(), 4u);
  const char* names[] = {"loss.png", "throughput.png", "memory.png", "expert_load.png"};
  const int panels[] = {4, 3, 1, 2};  // loss + extra losses + grad norm + lr; speed; memory; expert load
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(written[size_t(i)], dir / "plots" / names[i]);
    const Png p = read_png(written[size_t(i)]);
    EXPECT_EQ(p.height, 44 + 330 * panels[i]) << names[i];
    EXPECT_GT(p.blue, 500) << names[i];
    EXPECT_GT(p.inked, 20000) << names[i];
  }
  write_metrics(dir / "dense.jsonl", /*moe=*/false);
  const auto dense = write_run_plots(dir / "dense.jsonl", dir / "dense");
  EXPECT_EQ(dense.size(), 3u);  // no expert load without MoE
  EXPECT_EQ(read_png(dense[0]).height, 44 + 330 * 3);  // no extra losses either
  fs::remove_all(dir);
}

TEST(Plots, MemorySnapshotBecomesABarChart) {
  const fs::path dir = fresh_folder("snapshot");
  const fs::path json = dir / "rank0_memory_snapshot.json";
  std::ofstream(json) << nlohmann::json{
      {"step", 10}, {"rank", 0}, {"peak_bytes", 5 << 20},
      {"by_category", {{"params", 2 << 20}, {"activations", 3 << 20}}},
      {"by_site", {{{"site", "params / model build"}, {"bytes", 2 << 20}},
                   {{"site", "activations / linear.fwd"}, {"bytes", 3 << 20}}}}}.dump();
  const fs::path png = plot_memory_snapshot(json);
  EXPECT_EQ(png, dir / "rank0_memory_snapshot.png");
  const Png p = read_png(png);
  EXPECT_EQ(p.height, 60 + 60 + 26 * 4);  // two categories and two sites
  EXPECT_GT(p.blue, 2000);
  std::ofstream(dir / "other.json") << "{}";
  EXPECT_NE(error_of([&] { plot_memory_snapshot(dir / "other.json"); }).find("is not a memory snapshot"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Plots, NothingToPlotIsNamed) {
  const fs::path dir = fresh_folder("none");
  const std::string missing = error_of([&] { write_run_plots(dir / "metrics.jsonl", dir / "plots"); });
  EXPECT_NE(missing.find("cannot read " + (dir / "metrics.jsonl").string()), std::string::npos) << missing;
  std::ofstream(dir / "metrics.jsonl") << R"({"kind":"event","text":"resumed"})" << "\n";
  const std::string empty = error_of([&] { write_run_plots(dir / "metrics.jsonl", dir / "plots"); });
  EXPECT_NE(empty.find("has no training steps to plot"), std::string::npos) << empty;
  fs::remove_all(dir);
}
