#include "titan/cli/plot_cli.h"

#include <cstdio>
#include <filesystem>

#include "titan/cli/args.h"
#include "titan/train/plots.h"

namespace titan::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: titan plot RUN_DIR [--metrics FILE] [--out DIR]\n"
    "       titan plot --compare OUT.png RUN_DIR... (the runs' losses in one chart, one line per run)\n"
    "\n"
    "Draws the plots of a run from RUN_DIR/metrics.jsonl (or --metrics FILE) into RUN_DIR/plots (or --out DIR):\n"
    "loss.png, throughput.png, memory.png and, for MoE models, expert_load.png; and a PNG beside every\n"
    "*_memory_snapshot.json under RUN_DIR. The trainer draws them itself at the end of a run\n"
    "(metrics.enable_plots).\n";

}  // namespace

int plot_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("plot", kUsage, [&] {
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!args.empty() && args[0] == "--compare") {
      if (args.size() < 3) throw UsageError{"--compare needs OUT.png and at least one RUN_DIR"};
      std::vector<fs::path> runs(args.begin() + 2, args.end());
      train::write_comparison_plot(fs::path(args[1]), "Loss by run", runs);
      std::printf("%s\n", std::string(args[1]).c_str());
      return 0;
    }
    fs::path run, metrics, out;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--metrics" || args[i] == "--out") {
        if (i + 1 == args.size()) throw UsageError{std::string(args[i]) + " needs a value"};
        (args[i] == "--metrics" ? metrics : out) = fs::path(args[++i]);
      } else if (args[i].starts_with("-") || !run.empty()) {
        throw UsageError{"unexpected argument '" + std::string(args[i]) + "'"};
      } else {
        run = fs::path(args[i]);
      }
    }
    if (run.empty()) throw UsageError{"expected: RUN_DIR"};
    if (metrics.empty()) metrics = run / "metrics.jsonl";
    if (out.empty()) out = run / "plots";
    for (const fs::path& png : train::write_run_plots(metrics, out)) std::printf("%s\n", png.c_str());
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(run, ec); !ec && it != fs::recursive_directory_iterator(); ++it)
      if (it->is_regular_file() && it->path().filename().string().ends_with("_memory_snapshot.json"))
        std::printf("%s\n", train::plot_memory_snapshot(it->path()).c_str());
    return 0;
  });
}

}  // namespace titan::cli
