// Helpers of the multi-rank training tests: one dataset every rank shares, configs of the debug
// models, a run on a group of ranks, and the 1-rank reference run beside it.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/byte_dataset.h"
#include "common/error_of.h"
#include "common/run_toml.h"
#include "titan/core/rng.h"
#include "titan/distributed/comm_engine.h"
#include "titan/train/trainer.h"

namespace titan::test {

namespace fs = std::filesystem;

inline const distributed::ProcessGroup& world() { return distributed::CommEngine::get().world(); }

// A folder every rank agrees on (rank 0 names it), emptied by rank 0.
inline fs::path shared_folder(const std::string& tag) {
  std::string name = (fs::temp_directory_path() / ("titan_" + tag + "_" + std::to_string(::getpid()))).string();
  name = world().all_gather(name)[0];
  if (world().rank() == 0) {
    fs::remove_all(name);
    fs::create_directories(name);
  }
  world().barrier().wait();
  return name;
}

// The templated corpus of the e2e tests as byte tokens, prepared once by rank 0.
inline fs::path shared_dataset(const fs::path& dir) {
  if (world().rank() == 0) prepare_templated_dataset(dir);
  world().barrier().wait();
  return dir / "prepared";
}

// A suite of training runs sharing one folder (named by `tag`) and one templated byte dataset of
// `vocab` tokens, both made by rank 0 before the suite and removed after it. The suite class
// derives from TrainingSuite<Itself, tag, vocab>; root() and data() are the paths.
template <class Suite, int32_t vocab = 257>
class TrainingSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(shared_folder(Suite::kTag));
    if (world().rank() == 0) prepare_templated_dataset(*root_, vocab);
    world().barrier().wait();
    data_ = new fs::path(*root_ / "prepared");
  }
  static void TearDownTestSuite() {
    world().barrier().wait();
    if (world().rank() == 0) fs::remove_all(*root_);
    delete root_;
    delete data_;
    root_ = data_ = nullptr;
  }
  static const fs::path& root() { return *root_; }
  static const fs::path& data() { return *data_; }

 private:
  static inline fs::path* root_ = nullptr;
  static inline fs::path* data_ = nullptr;
};

// The [parallelism] degrees of a layout (1: that dimension not split).
struct Degrees {
  int64_t replicate = 1, shard = 1, cp = 1, tp = 1, ep = 1;
};

// The config of a `model` debug run of 20 steps into `run` laid out as `d`, with `extra`
// overrides: a global batch of 4 sequences, each data-parallel rank's share of it per step.
inline train::JobConfig layout_config(const std::string& model, const fs::path& data, const fs::path& run,
                                      const Degrees& d, const std::vector<std::string>& extra = {}) {
  std::string toml = base_toml(model, data, run, 20);
  toml += "[parallelism]\ndata_parallel_replicate_degree = " + std::to_string(d.replicate) +
          "\ndata_parallel_shard_degree = " + std::to_string(d.shard) + "\ncontext_parallel_degree = " +
          std::to_string(d.cp) + "\ntensor_parallel_degree = " + std::to_string(d.tp) +
          "\nexpert_parallel_degree = " + std::to_string(d.ep) + "\n";
  train::JobConfig cfg = train::parse_config(toml, run.filename().string() + ".toml", extra);
  cfg.training.global_batch_size = 4;
  cfg.training.local_batch_size = 4 / (d.replicate * d.shard);
  return cfg;
}

// Trains `config` on `group` (every member calls it) and returns the losses (on every member).
inline std::vector<double> train_on(const train::JobConfig& config, const distributed::ProcessGroup& group) {
  {
    train::Trainer t(config, "test", &group);
    t.train();
  }
  group.barrier().wait();
  return losses_of(config.job.dump_folder);
}

// The group of rank 0 alone (every rank calls it once; the others get their own group).
inline const distributed::ProcessGroup& solo() {
  static std::unique_ptr<distributed::ProcessGroup> g =
      distributed::CommEngine::get().split(world(), world().rank() == 0 ? 0 : 1, world().rank(), "solo");
  return *g;
}

// Runs `config` on rank 0 alone while the others wait: the 1-rank reference. Returns its losses on
// every rank.
inline std::vector<double> reference_on_rank0(const train::JobConfig& config) {
  const distributed::ProcessGroup& one = solo();
  if (world().rank() == 0) {
    train::Trainer t(config, "reference", &one);
    t.train();
  }
  world().barrier().wait();
  return losses_of(config.job.dump_folder);
}

// Every step's loss within `relative` of the reference's (0: equal to the last bit).
inline void expect_same_losses(const std::vector<double>& want, const std::vector<double>& got, double relative,
                               const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  if (std::getenv("TITAN_PRINT_LOSSES"))  // every step's pair and relative difference, to see where two runs part
    for (size_t i = 0; i < want.size(); ++i)
      std::fprintf(stderr, "%s step %zu: %.9g %.9g rel %.3g\n", what.c_str(), i + 1, want[i], got[i], (got[i] - want[i]) / want[i]);
  for (size_t i = 0; i < want.size(); ++i) {
    if (relative == 0) EXPECT_EQ(got[i], want[i]) << what << ", step " << i + 1;
    else EXPECT_NEAR(got[i], want[i], relative * std::fabs(want[i])) << what << ", step " << i + 1;
  }
}

// DeepSeek-V3.2's sparse stage under a layout that sums in another order than one rank (CP's key
// gradients over chunks, weight gradients over ranks): once the parameters differ in their last
// bits, a near-tie in the indexer's top-k keys or the MoE routing can flip, and the runs part by
// ~1e-5..1e-4 from there (measured on the AMD EPYC with AVX-512: a flip at step 14 of 20 at
// lr 3e-4, then <= 2.2e-4 relative; on Zen 3 none, <= 1e-7). The first step, with equal
// parameters, must agree to 1e-6 (a wrong chunk or key block shows there at once); every step
// within `relative`.
inline void expect_same_losses_through_flips(const std::vector<double>& want, const std::vector<double>& got,
                                             double relative, const std::string& what) {
  ASSERT_FALSE(want.empty()) << what;
  ASSERT_FALSE(got.empty()) << what;
  EXPECT_NEAR(got[0], want[0], 1e-6 * std::fabs(want[0])) << what << ", step 1 (the same parameters)";
  expect_same_losses(want, got, relative, what);
}

// A tensor of normal(0, 1) values keyed by (seed, name), the same on every rank.
inline Tensor random_normal(const Shape& shape, uint64_t seed, const std::string& name, double std = 1.0) {
  Tensor t = Tensor::empty(shape, DType::f32);
  init_normal(t, seed, name, 0, std);
  return t;
}

// got equals want within tol times want's largest magnitude, or times floor when that is larger
// (a tensor that is 0 but for rounding), the worst element reported.
inline void expect_close(const Tensor& want, const Tensor& got, double tol, const std::string& what, double floor = 1e-30) {
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const Tensor w = want.to(DType::f32), g = got.to(DType::f32);
  double scale = 0;
  for (int64_t i = 0; i < w.numel(); ++i) scale = std::max(scale, double(std::fabs(w.data<float>()[i])));
  int64_t worst = 0;
  double worst_err = -1;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double err = std::fabs(double(g.data<float>()[i]) - double(w.data<float>()[i]));
    if (!(err <= worst_err)) worst_err = err, worst = i;  // NaN counts as worst
  }
  if (w.numel() > 0) {
    EXPECT_NEAR(g.data<float>()[worst], w.data<float>()[worst], tol * std::max(scale, floor)) << what << " at " << worst;
  }
}

// The bytes this rank sent on `group` per collective type equal the analytic minimum (ratio 1
// within 1e-9); an op the stats lack sent nothing.
inline void expect_analytic_traffic(const std::map<std::pair<std::string, distributed::CommOp>, distributed::CommStats>& stats,
                                    const std::string& group, const std::map<distributed::CommOp, double>& want_bytes) {
  for (const auto& [op, bytes] : want_bytes) {
    const auto it = stats.find({group, op});
    const double sent = it == stats.end() ? 0 : double(it->second.bytes);
    EXPECT_NEAR(sent / bytes, 1.0, 1e-9) << group << " " << distributed::comm_op_name(op) << ": " << sent
                                         << " bytes sent, " << bytes << " analytic";
  }
}

// Overrides for validation every 10 steps over 2 batches of per_rank sequences of 64 tokens.
inline std::vector<std::string> validation_every_10(int64_t per_rank) {
  return {"--validation.enable=true", "--validation.freq=10", "--validation.steps=2", "--validation.seq_len=64",
          "--validation.local_batch_size=" + std::to_string(per_rank)};
}

}  // namespace titan::test
