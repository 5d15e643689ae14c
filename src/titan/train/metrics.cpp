#include "titan/train/metrics.h"

#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/distributed/runtime.h"
#include "titan/train/tensorboard.h"

namespace titan::train {

namespace fs = std::filesystem;

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  const long t = long(std::lround(std::max(0.0, s)));
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string format_step_line(const StepMetrics& m, bool color) {
  // TorchTitan's palette: step red, loss green, memory yellow, throughput blue, TFLOP/s cyan, MFU magenta.
  const auto paint = [color](const char* code, const std::string& text) {
    return color ? std::string("\033[") + code + "m" + text + "\033[39m" : text;
  };
  char buf[128];
  std::string line;
  const double pct = m.total_steps > 0 ? 100.0 * double(m.step) / double(m.total_steps) : 0;
  std::snprintf(buf, sizeof buf, "step %5lld/%lld (%3.0f%%)", static_cast<long long>(m.step),
                static_cast<long long>(m.total_steps), pct);
  line += paint("31", buf);
  std::snprintf(buf, sizeof buf, "loss %7.4f", m.loss);
  line += " | " + paint("32", buf);
  std::snprintf(buf, sizeof buf, " | grad_norm %7.4g | lr %.2e", m.grad_norm, m.lr);
  line += buf;
  std::snprintf(buf, sizeof buf, "%8.0f tok/s", m.tokens_per_second);
  line += " | " + paint("34", buf);
  std::snprintf(buf, sizeof buf, "%6.2f TFLOP/s", m.tflops);
  line += " | " + paint("36", buf);
  std::snprintf(buf, sizeof buf, "MFU %5.1f%%", 100 * m.mfu);
  line += " | " + paint("35", buf);
  line += " | " + paint("33", "mem " + format_bytes(double(m.memory.peak_total)));
  line += " | ETA " + format_duration(m.eta_seconds);
  for (const auto& [k, v] : m.summary) {
    std::snprintf(buf, sizeof buf, " | %s %.4g", k.c_str(), v);
    line += buf;
  }
  return line;
}

MetricsOptions metrics_options(const JobConfig& config, const fs::path& run_folder, int rank) {
  const Metrics& k = config.metrics;
  MetricsOptions o;
  o.console = rank == 0 ? stdout : nullptr;
  // Under mpirun a rank's stdout is a pseudo-terminal whatever the user's is: colour only a
  // console the process owns.
  o.color = rank == 0 && !k.disable_color_printing && isatty(fileno(stdout)) && !distributed::launch_info().launched();
  if (k.enable_jsonl && (rank == 0 || k.save_for_all_ranks)) {
    const fs::path file = k.jsonl_file;
    o.jsonl = run_folder / (rank == 0 ? file
                                      : file.parent_path() / (file.stem().string() + "_rank" + std::to_string(rank) +
                                                              file.extension().string()));
  }
  if (k.enable_tensorboard && (rank == 0 || k.save_for_all_ranks)) {
    o.tensorboard = run_folder / k.save_tb_folder;
    if (rank != 0) o.tensorboard /= "rank_" + std::to_string(rank);
  }
  return o;
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::vector<std::pair<std::string, double>> s = {{"loss_metrics/global_avg_loss", m.loss},
                                                   {"grad_norm", m.grad_norm},
                                                   {"lr", m.lr},
                                                   {"throughput_all_ranks(tps)", m.tokens_per_second},
                                                   {"tflops_all_ranks", m.tflops},
                                                   {"mfu(%)", 100 * m.mfu},
                                                   {"time_metrics/end_to_end(s)", m.step_seconds},
                                                   {"time_metrics/data_loading(%)", 100 * m.data_share},
                                                   {"memory/peak_total(GiB)", double(m.memory.peak_total) / kGiB}};
  for (int c = 0; c < kNumMemCategories; ++c)
    s.emplace_back("memory/" + std::string(mem_category_name(MemCategory(c))) + "(GiB)", double(m.memory.peak[c]) / kGiB);
  for (const auto& [k, v] : m.summary) s.emplace_back((k.ends_with("_loss") ? "loss_metrics/" : "") + k, v);
  for (const auto& [k, v] : m.detail) s.emplace_back(k, v);
  return s;
}

MetricsLogger::MetricsLogger(const fs::path& run_folder, std::FILE* console)
    : MetricsLogger(MetricsOptions{.jsonl = run_folder / "metrics.jsonl", .tensorboard = {}, .console = console, .color = false}) {}

MetricsLogger::MetricsLogger(const MetricsOptions& o) : console_(o.console), color_(o.color) {
  if (!o.tensorboard.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(o.tensorboard);
  if (o.jsonl.empty()) return;
  if (o.jsonl.has_parent_path()) fs::create_directories(o.jsonl.parent_path());
  jsonl_ = std::fopen(o.jsonl.c_str(), "a");
  TITAN_CHECK(jsonl_, "cannot open " + o.jsonl.string() + " for appending",
              "check that job.dump_folder is writable and metrics.jsonl_file names a file");
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_) std::fclose(jsonl_);
}

void MetricsLogger::write_json(const std::string& line) {
  if (!jsonl_) return;
  std::fprintf(jsonl_, "%s\n", line.c_str());
  std::fflush(jsonl_);
}

void MetricsLogger::log_step(const StepMetrics& m) {
  nlohmann::json j = {{"kind", "train"},
                      {"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"step_seconds", m.step_seconds},
                      {"tokens_per_second", m.tokens_per_second},
                      {"tflops", m.tflops},
                      {"mfu", m.mfu},
                      {"data_share", m.data_share},
                      {"eta_seconds", m.eta_seconds}};
  nlohmann::json mem = nlohmann::json::object();
  for (int c = 0; c < kNumMemCategories; ++c) mem[std::string(mem_category_name(MemCategory(c)))] = m.memory.peak[c];
  mem["total"] = m.memory.peak_total;
  j["peak_memory_bytes"] = mem;
  for (const auto& [k, v] : m.summary) j[k] = v;
  for (const auto& [k, v] : m.detail) j[k] = v;
  write_json(j.dump());
  if (tensorboard_) tensorboard_->add_scalars(m.step, tensorboard_scalars(m));
  if (console_) {
    std::fprintf(console_, "%s\n", format_step_line(m, color_).c_str());
    std::fflush(console_);
  }
}

void MetricsLogger::log_validation(int64_t step, double loss, double perplexity) {
  write_json(nlohmann::json{{"kind", "validation"}, {"step", step}, {"loss", loss}, {"perplexity", perplexity}}.dump());
  if (tensorboard_)
    tensorboard_->add_scalars(step, {{"validation_metrics/loss", loss}, {"validation_metrics/perplexity", perplexity}});
  if (console_) std::fprintf(console_, "validation step %lld | loss %.4f | perplexity %.2f\n",
                             static_cast<long long>(step), loss, perplexity);
}

void MetricsLogger::log_event(const std::string& text) {
  write_json(nlohmann::json{{"kind", "event"}, {"text", text}}.dump());
  if (console_) std::fprintf(console_, "%s\n", text.c_str());
}

}  // namespace titan::train
