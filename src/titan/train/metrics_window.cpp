#include "titan/train/metrics_window.h"

#include <algorithm>
#include <cstdio>
#include <span>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/clock.h"

namespace titan::train {

namespace {

// A rank that works this much longer per step than the median rank is named a straggler.
constexpr double kStragglerRatio = 1.25;

// How unevenly the ranks work: each rank's seconds of a window not spent blocked waiting for
// communication (compute, data, optimizer). The rank the others wait for has the most.
struct BusySpread {
  double ratio = 1;  // the slowest rank's busy seconds / the median rank's
  int slowest = 0;
  double slowest_seconds = 0, median_seconds = 0;
};
// Also sums `totals` over the ranks, in the same reduction (one collective per metrics line).
BusySpread busy_spread(const distributed::ProcessGroup& world, double busy, std::vector<double>& totals) {
  std::vector<double> all(size_t(world.size()), 0.0);
  all[size_t(world.rank())] = busy;
  all.insert(all.end(), totals.begin(), totals.end());
  world.all_reduce(std::span<double>(all));
  std::copy(all.end() - std::ptrdiff_t(totals.size()), all.end(), totals.begin());
  all.resize(size_t(world.size()));
  BusySpread s;
  s.slowest = int(std::max_element(all.begin(), all.end()) - all.begin());
  s.slowest_seconds = all[size_t(s.slowest)];
  std::sort(all.begin(), all.end());
  s.median_seconds = all[(all.size() - 1) / 2];
  s.ratio = s.median_seconds > 0 ? s.slowest_seconds / s.median_seconds : 1;
  return s;
}

}  // namespace

MetricsWindow::MetricsWindow(const distributed::ProcessGroup& world, distributed::CommEngine& engine, Shape shape)
    : world_(world), engine_(engine), shape_(shape) {
  restart();
}

void MetricsWindow::restart() {
  start_ = steady_seconds();
  exposed_at_start_ = engine_.exposed_seconds();
  sent_at_start_ = engine_.total();
  data_seconds_ = flops_ = save_seconds_ = 0;
  steps_ = 0;
}

void MetricsWindow::add_step(double data_seconds, double flops_per_token) {
  ++steps_;
  data_seconds_ += data_seconds;
  flops_ += flops_per_token * shape_.tokens_per_step * shape_.pipeline_share;
}

std::string MetricsWindow::close(StepMetrics& m) {
  const double window = steady_seconds() - start_, steps = double(std::max<int64_t>(steps_, 1));
  m.tokens_per_second = steps * shape_.tokens_per_step * double(shape_.dp) / window;
  m.tflops = flops_ * double(shape_.dp) / shape_.pipeline_share / window / 1e12;
  m.mfu = flops_ / window / shape_.peak_flops;
  m.data_share = data_seconds_ / window;
  // Memory: the largest peak of any rank, per category; communication: the largest share of the
  // window any rank spent blocked waiting for it.
  m.memory = memory_stats();
  const double exposed = engine_.exposed_seconds() - exposed_at_start_;
  std::vector<double> worst = {double(m.memory.peak_total), exposed / window};
  for (int64_t p : m.memory.peak) worst.push_back(double(p));
  world_.all_reduce(std::span<double>(worst), distributed::ReduceOp::max);
  m.memory.peak_total = int64_t(worst[0]);
  for (size_t i = 0; i < m.memory.peak.size(); ++i) m.memory.peak[i] = int64_t(worst[2 + i]);
  if (save_seconds_ > 0) m.detail.emplace_back("checkpoint_seconds", save_seconds_);
  std::string straggler;
  if (world_.size() > 1) {
    m.detail.emplace_back("comm_exposed_share", worst[1]);
    // Bytes all ranks sent per step over the window: those that crossed hosts, those that stayed.
    const distributed::CommStats sent = engine_.total();
    std::vector<double> bytes = {double(sent.bytes - sent_at_start_.bytes),
                                 double(sent.cross_host_bytes - sent_at_start_.cross_host_bytes)};
    const BusySpread spread = busy_spread(world_, (window - exposed) / steps, bytes);
    m.detail.emplace_back("comm_bytes_cross_host", bytes[1] / steps);
    m.detail.emplace_back("comm_bytes_local", (bytes[0] - bytes[1]) / steps);
    m.detail.emplace_back("rank_busy_spread", spread.ratio);
    m.detail.emplace_back("slowest_rank", spread.slowest);
    if (spread.ratio > kStragglerRatio) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "straggler: rank %d worked %.3f s per step over the last %lld steps, the median rank %.3f s (%.2fx); "
                    "the others wait for it",
                    spread.slowest, spread.slowest_seconds, static_cast<long long>(steps_), spread.median_seconds,
                    spread.ratio);
      straggler = text;
    }
  }
  restart();
  return straggler;
}

}  // namespace titan::train
