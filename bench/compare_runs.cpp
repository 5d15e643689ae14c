// Training-loss curves of several runs in one PNG (e.g. Muon against AdamW on the same tokens,
// bench/muon_convergence.sh), each run's final validation loss in its legend label; --panel starts
// a chart of its own below the others (e.g. one per model).
//
//   build/bench/compare_runs OUT.png "TITLE" [--panel "PANEL TITLE"] LABEL=RUN_DIR [LABEL=RUN_DIR ...]
//                            [--panel "PANEL TITLE" LABEL=RUN_DIR ...]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/train/chart.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: compare_runs OUT.png TITLE [--panel PANEL_TITLE] LABEL=RUN_DIR [...]\n");
    return 2;
  }
  std::vector<titan::train::ChartPanel> panels;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--panel" && i + 1 < argc) {
      panels.push_back({argv[++i], "step", "training loss (nats/token)", {}});
      continue;
    }
    if (panels.empty()) panels.push_back({"training loss", "step", "loss (nats/token)", {}});
    titan::train::ChartPanel& panel = panels.back();
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "compare_runs: '%s' is not LABEL=RUN_DIR\n", arg.c_str());
      return 2;
    }
    titan::train::ChartSeries s;
    s.label = arg.substr(0, eq);
    std::ifstream f(arg.substr(eq + 1) + "/metrics.jsonl");
    if (!f) {
      std::fprintf(stderr, "compare_runs: no metrics.jsonl in %s\n", arg.substr(eq + 1).c_str());
      return 1;
    }
    double validation = -1;
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "train") s.x.push_back(j["step"].get<double>()), s.y.push_back(j["loss"].get<double>());
      if (j["kind"] == "validation" && j.contains("loss")) validation = j["loss"].get<double>();
    }
    if (validation >= 0) s.label += fmt::format(" val {:.3f}", validation);  // the legend is narrow
    std::printf("%s: %zu steps, last loss %.4f\n", s.label.c_str(), s.y.size(), s.y.empty() ? 0.0 : s.y.back());
    panel.series.push_back(std::move(s));
  }
  titan::train::draw_line_charts(argv[1], argv[2], panels);
  return 0;
}
