#include "titan/train/metrics.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"

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

std::string format_step_line(const StepMetrics& m) {
  char buf[512];
  const double pct = m.total_steps > 0 ? 100.0 * double(m.step) / double(m.total_steps) : 0;
  std::snprintf(buf, sizeof buf,
                "step %5lld/%lld (%3.0f%%) | loss %7.4f | grad_norm %7.4g | lr %.2e | %8.0f tok/s | %6.2f TFLOP/s | "
                "MFU %5.1f%% | mem %s (params %s, grads %s, optim %s, act %s) | data %4.1f%% | ETA %s",
                static_cast<long long>(m.step), static_cast<long long>(m.total_steps), pct, m.loss, m.grad_norm,
                m.lr, m.tokens_per_second, m.tflops, 100 * m.mfu, format_bytes(double(m.memory.peak_total)).c_str(),
                format_bytes(double(m.memory.peak[int(MemCategory::parameters)])).c_str(),
                format_bytes(double(m.memory.peak[int(MemCategory::gradients)])).c_str(),
                format_bytes(double(m.memory.peak[int(MemCategory::optimizer_state)])).c_str(),
                format_bytes(double(m.memory.peak[int(MemCategory::activations)])).c_str(), 100 * m.data_share,
                format_duration(m.eta_seconds).c_str());
  std::string line = buf;
  for (const auto& [k, v] : m.extra) {
    char e[96];
    std::snprintf(e, sizeof e, " | %s %.4g", k.c_str(), v);
    line += e;
  }
  return line;
}

MetricsLogger::MetricsLogger(const fs::path& run_folder, std::FILE* console) : console_(console) {
  fs::create_directories(run_folder);
  const fs::path p = run_folder / "metrics.jsonl";
  jsonl_ = std::fopen(p.c_str(), "a");
  TITAN_CHECK(jsonl_, "cannot open " + p.string() + " for appending", "check job.dump_folder is writable");
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_) std::fclose(jsonl_);
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
                      {"data_share", m.data_share}};
  nlohmann::json mem = nlohmann::json::object();
  for (int c = 0; c < kNumMemCategories; ++c) mem[std::string(mem_category_name(MemCategory(c)))] = m.memory.peak[c];
  mem["total"] = m.memory.peak_total;
  j["peak_memory_bytes"] = mem;
  for (const auto& [k, v] : m.extra) j[k] = v;
  std::fprintf(jsonl_, "%s\n", j.dump().c_str());
  std::fflush(jsonl_);
  if (console_) {
    std::fprintf(console_, "%s\n", format_step_line(m).c_str());
    std::fflush(console_);
  }
}

void MetricsLogger::log_validation(int64_t step, double loss, double perplexity) {
  const nlohmann::json j = {{"kind", "validation"}, {"step", step}, {"loss", loss}, {"perplexity", perplexity}};
  std::fprintf(jsonl_, "%s\n", j.dump().c_str());
  std::fflush(jsonl_);
  if (console_) std::fprintf(console_, "validation step %lld | loss %.4f | perplexity %.2f\n",
                             static_cast<long long>(step), loss, perplexity);
}

void MetricsLogger::log_event(const std::string& text) {
  const nlohmann::json j = {{"kind", "event"}, {"text", text}};
  std::fprintf(jsonl_, "%s\n", j.dump().c_str());
  std::fflush(jsonl_);
  if (console_) std::fprintf(console_, "%s\n", text.c_str());
}

}  // namespace titan::train
