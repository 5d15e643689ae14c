#include "titan/train/plots.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "titan/core/error.h"
#include "titan/train/chart.h"
#include "titan/train/metrics.h"

namespace titan::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The logged steps of a run, one entry per step (the last line logged for it).
struct RunMetrics {
  std::map<int64_t, json> train;
  std::map<int64_t, double> validation_loss;
};

RunMetrics read_metrics(const fs::path& file) {
  std::ifstream in(file);
  TITAN_CHECK(in.good(), "cannot read " + file.string() + " to plot it",
              "pass the run folder (job.dump_folder) of a run that logged metrics (metrics.enable_jsonl = true)");
  RunMetrics m;
  std::string line;
  while (std::getline(in, line)) {
    // A line cut short (a process killed while writing it) is skipped, not fatal.
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    const std::string kind = j.value("kind", "");
    if (kind == "train") m.train[step] = j;
    else if (kind == "validation" && j.contains("loss") && j["loss"].is_number())
      m.validation_loss[step] = j["loss"].get<double>();
  }
  return m;
}

double number(const json& j, const std::string& key, double scale = 1) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() * scale : NAN;
}

// The series of key `key` over the training steps (NaN where a step lacks it).
ChartSeries series(const RunMetrics& m, const std::string& label, const std::string& key, double scale = 1) {
  ChartSeries s{label, {}, {}, -1, false};
  for (const auto& [step, j] : m.train) s.x.push_back(double(step)), s.y.push_back(number(j, key, scale));
  return s;
}

// Keys of the training lines, in order, that satisfy `pick`.
template <class Pick>
std::vector<std::string> keys_where(const RunMetrics& m, Pick pick) {
  std::vector<std::string> keys;
  for (const auto& [step, j] : m.train)
    for (const auto& [k, v] : j.items())
      if (v.is_number() && pick(k) && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}

int layer_of(const std::string& key) {
  const size_t at = key.rfind("/layer");
  return at == std::string::npos ? -1 : std::atoi(key.c_str() + at + 6);
}

fs::path loss_plot(const RunMetrics& m, const fs::path& folder) {
  ChartPanel loss{"Loss", "step", "cross-entropy (nats / token)", {series(m, "training", "loss")}};
  if (!m.validation_loss.empty()) {
    ChartSeries v{"validation", {}, {}, -1, false};
    for (const auto& [step, l] : m.validation_loss) v.x.push_back(double(step)), v.y.push_back(l);
    loss.series.push_back(v);
  }
  std::vector<ChartPanel> panels{loss};
  const auto extra = keys_where(m, [](const std::string& k) { return k != "loss" && k.ends_with("_loss"); });
  if (!extra.empty()) {
    ChartPanel p{"Extra losses", "step", "loss", {}};
    for (const std::string& k : extra) p.series.push_back(series(m, k, k));
    panels.push_back(p);
  }
  panels.push_back({"Gradient norm", "step", "L2 norm of all gradients", {series(m, "grad norm", "grad_norm")}});
  panels.push_back({"Learning rate", "step", "learning rate", {series(m, "lr", "lr")}});
  const fs::path png = folder / "loss.png";
  draw_line_charts(png, "Training loss", panels);
  return png;
}

fs::path throughput_plot(const RunMetrics& m, const fs::path& folder) {
  const std::vector<ChartPanel> panels{
      {"Throughput", "step", "tokens / s (all data-parallel ranks)", {series(m, "tokens/s", "tokens_per_second")}},
      {"Model FLOPs utilization", "step", "MFU (%)", {series(m, "MFU", "mfu", 100)}},
      {"Step time", "step", "seconds",
       {series(m, "step", "step_seconds"), series(m, "checkpoint save (blocking)", "checkpoint_seconds")}}};
  const fs::path png = folder / "throughput.png";
  draw_line_charts(png, "Speed", panels);
  return png;
}

fs::path memory_plot(const RunMetrics& m, const fs::path& folder) {
  std::vector<std::string> categories;
  for (const auto& [step, j] : m.train)
    if (j.contains("peak_memory_bytes") && j["peak_memory_bytes"].is_object())
      for (const auto& [k, v] : j["peak_memory_bytes"].items())
        if (v.is_number() && v.get<double>() > 0 && std::find(categories.begin(), categories.end(), k) == categories.end())
          categories.push_back(k);
  ChartPanel p{"Peak memory of each step by category (each category's own peak; total: the peak of the sum)", "step",
               "MiB", {}};
  for (const std::string& c : categories) {
    ChartSeries s{c, {}, {}, -1, false};
    for (const auto& [step, j] : m.train) {
      s.x.push_back(double(step));
      s.y.push_back(j.contains("peak_memory_bytes") ? number(j["peak_memory_bytes"], c, 1 / kMiB) : NAN);
    }
    p.series.push_back(s);
  }
  const fs::path png = folder / "memory.png";
  draw_line_charts(png, "Memory", {p});
  return png;
}

fs::path expert_plot(const RunMetrics& m, const fs::path& folder, const std::vector<std::string>& imbalance_keys) {
  std::vector<std::string> keys = imbalance_keys;
  std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return layer_of(a) < layer_of(b); });
  ChartPanel ratio{"Busiest expert's tokens over the mean, per MoE layer (1 = balanced)", "step", "max / mean", {}};
  ChartPanel tokens{"Tokens of the busiest (solid) and the idlest (dashed) expert, per MoE layer", "step",
                    "tokens per step", {}};
  for (const std::string& k : keys) {
    const std::string layer = "layer " + std::to_string(layer_of(k));
    ratio.series.push_back(series(m, layer, k));
    const int color = int(ratio.series.size()) - 1;
    ChartSeries most = series(m, layer + " busiest", "moe_load_max/layer" + std::to_string(layer_of(k)));
    ChartSeries least = series(m, layer + " idlest", "moe_load_min/layer" + std::to_string(layer_of(k)));
    most.color = least.color = color;
    least.dashed = true;
    tokens.series.push_back(most);
    tokens.series.push_back(least);
  }
  const fs::path png = folder / "expert_load.png";
  draw_line_charts(png, "Expert load", {ratio, tokens});
  return png;
}

}  // namespace

void write_comparison_plot(const fs::path& png, const std::string& title, const std::vector<fs::path>& runs) {
  ChartPanel train{"Training loss", "step", "cross-entropy (nats / token)", {}};
  ChartPanel validation{"Validation loss", "step", "cross-entropy (nats / token)", {}};
  for (const fs::path& run : runs) {
    const RunMetrics m = read_metrics(run / "metrics.jsonl");
    const std::string label = run.filename().string();
    train.series.push_back(series(m, label, "loss"));
    ChartSeries v{label, {}, {}, -1, false};
    for (const auto& [step, l] : m.validation_loss) v.x.push_back(double(step)), v.y.push_back(l);
    validation.series.push_back(v);
  }
  std::vector<ChartPanel> panels{train};
  if (!validation.series.front().x.empty()) panels.push_back(validation);
  fs::create_directories(png.parent_path().empty() ? fs::path(".") : png.parent_path());
  draw_line_charts(png, title, panels);
}

std::vector<fs::path> write_run_plots(const fs::path& metrics_jsonl, const fs::path& folder) {
  const RunMetrics m = read_metrics(metrics_jsonl);
  TITAN_CHECK(!m.train.empty(), metrics_jsonl.string() + " has no training steps to plot",
              "plot a run that logged at least one step (metrics.log_freq <= training.steps)");
  std::vector<fs::path> written{loss_plot(m, folder), throughput_plot(m, folder), memory_plot(m, folder)};
  const auto moe = keys_where(m, [](const std::string& k) { return k.starts_with("moe_imbalance/layer"); });
  if (!moe.empty()) written.push_back(expert_plot(m, folder, moe));
  return written;
}

fs::path plot_memory_snapshot(const fs::path& snapshot_json) {
  std::ifstream in(snapshot_json);
  const json s = json::parse(in, nullptr, false);
  TITAN_CHECK(s.is_object() && s.contains("by_category") && s.contains("by_site"),
              snapshot_json.string() + " is not a memory snapshot (no by_category / by_site)",
              "pass a rank<r>_memory_snapshot.json written with profiling.enable_memory_snapshot = true");
  BarChart chart;
  chart.title = "Memory live at the peak of step " + std::to_string(s.value("step", int64_t(0))) + ", rank " +
                std::to_string(s.value("rank", 0)) + ": " + format_bytes(s.value("peak_bytes", 0.0));
  chart.value_label = "MiB (blue: each category in all; orange: the largest by category / allocating op)";
  std::vector<std::pair<double, std::string>> categories, sites;
  for (const auto& [k, v] : s["by_category"].items())
    if (v.is_number()) categories.emplace_back(v.get<double>() / kMiB, "all " + k);
  for (const json& e : s["by_site"])
    if (e.is_object() && e.contains("bytes") && e["bytes"].is_number())
      sites.emplace_back(e["bytes"].get<double>() / kMiB, e.value("site", "?"));
  const auto larger = [](const auto& a, const auto& b) { return a.first > b.first; };
  std::sort(categories.begin(), categories.end(), larger);
  std::sort(sites.begin(), sites.end(), larger);
  if (sites.size() > 16) sites.resize(16);  // the largest allocating ops
  for (int group : {0, 1})
    for (const auto& [mib, label] : group == 0 ? categories : sites)
      chart.labels.push_back(label), chart.values.push_back(mib), chart.group.push_back(group);
  fs::path png = snapshot_json;
  png.replace_extension(".png");
  draw_bar_chart(png, chart);
  return png;
}

}  // namespace titan::train
