// Fault tolerance inside a run: asynchronous checkpoints, falling back from a damaged newest
// checkpoint, and the policies for a non-finite step (llama3 debug, FSDP over every rank).
#include "distributed/common.h"

#include <set>

#include "titan/optim/adamw.h"

using namespace titan;
using namespace titan::test;

namespace {

class FaultTolerance : public TrainingSuite<FaultTolerance> {
 public:
  static constexpr const char* kTag = "fault_tolerance";

 protected:
  static train::JobConfig config(const std::string& name, std::vector<std::string> extra = {}) {
    std::string toml = base_toml("llama3", data(), root() / name, 20);
    toml += "[parallelism]\ndata_parallel_shard_degree = -1\n";
    train::JobConfig cfg = train::parse_config(toml, name + ".toml", extra);
    cfg.training.global_batch_size = 4;
    cfg.training.local_batch_size = 4 / world().size();
    return cfg;
  }
  static std::vector<std::string> saving(const std::string& mode) {
    return {"--checkpoint.enable=true", "--checkpoint.interval=5", "--checkpoint.keep_latest_k=0",
            "--checkpoint.last_save_model_only=false", "--checkpoint.async_mode=" + mode};
  }
  // Each step's last logged loss (a rolled-back run logs the steps it replays again).
  static std::map<int64_t, double> by_step(const std::string& name) {
    std::map<int64_t, double> out;
    std::ifstream f(root() / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (const auto j = nlohmann::json::parse(line); j["kind"] == "train") out[j["step"].get<int64_t>()] = j["loss"];
    return out;
  }
  static std::vector<std::string> events(const std::string& name) {
    std::vector<std::string> out;
    std::ifstream f(root() / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (const auto j = nlohmann::json::parse(line); j["kind"] == "event") out.push_back(j["text"]);
    return out;
  }
  static std::string bytes_of(const fs::path& file) {
    std::ifstream f(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  static fs::path ckpt(const std::string& name, int step) {
    return root() / name / "checkpoint" / ("step-" + std::to_string(step));
  }
};

// An asynchronous save writes the same files as a synchronous one and does not disturb the run;
// a run resumed from one of them continues the same losses.
TEST_F(FaultTolerance, AsyncSavesWriteWhatSyncSavesWrite) {
  const auto plain = train_on(config("plain"), world());
  const auto sync = train_on(config("sync", saving("disabled")), world());
  const auto async = train_on(config("async", saving("async")), world());
  expect_same_losses(plain, sync, 0, "synchronous saves");
  expect_same_losses(plain, async, 0, "asynchronous saves");
  if (world().rank() == 0) {
    for (int step : {5, 10, 15, 20}) {
      for (const char* file : {"metadata.json", "shard-00000.safetensors", "shard-00001.safetensors"})
        EXPECT_EQ(bytes_of(ckpt("sync", step) / file), bytes_of(ckpt("async", step) / file)) << step << " " << file;
      EXPECT_FALSE(fs::exists(ckpt("async", step).string() + ".tmp")) << step;
    }
    fs::remove_all(ckpt("async", 15));
    fs::remove_all(ckpt("async", 20));
  }
  world().barrier().wait();
  const auto again = train_on(config("async", saving("async")), world());  // resumes from step 10
  ASSERT_EQ(again.size(), 30u) << "the resumed run logs steps 11..20 after the first run's 20";
  for (size_t i = 20; i < 30; ++i) EXPECT_EQ(again[i], plain[i - 10]) << "step " << i - 9;
}

// The newest checkpoint damaged (a flipped byte in one rank's file), the one before truncated and
// missing a file: both are reported and set aside, and the run resumes from the one before them, continuing the
// losses of the run that wrote them.
TEST_F(FaultTolerance, DamagedCheckpointsFallBackToTheStepBefore) {
  const auto straight = train_on(config("straight", saving("disabled")), world());
  if (world().rank() == 0) {
    fs::create_directories(root() / "damaged" / "checkpoint");
    fs::copy(root() / "straight" / "checkpoint", root() / "damaged" / "checkpoint", fs::copy_options::recursive);
    const fs::path flipped = ckpt("damaged", 20) / ("shard-0000" + std::to_string(world().size() - 1) + ".safetensors");
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x5a);
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
    f.close();
    const fs::path truncated = ckpt("damaged", 15) / "shard-00000.safetensors";
    fs::resize_file(truncated, fs::file_size(truncated) / 2);
    // ... and its other file lost: no rank sees it, so rank 0 judges it damage, not an I/O error.
    fs::remove(ckpt("damaged", 15) / ("shard-0000" + std::to_string(world().size() - 1) + ".safetensors"));
  }
  world().barrier().wait();
  train_on(config("damaged", saving("disabled")), world());
  const auto resumed = by_step("damaged");
  ASSERT_EQ(resumed.size(), 10u);  // steps 11..20: resumed from step 10
  for (int64_t step = 11; step <= 20; ++step) EXPECT_EQ(resumed.at(step), straight[size_t(step - 1)]) << step;
  EXPECT_TRUE(fs::exists(ckpt("damaged", 20).string() + ".corrupt"));
  EXPECT_TRUE(fs::exists(ckpt("damaged", 15).string() + ".corrupt"));
  EXPECT_TRUE(fs::exists(ckpt("damaged", 20) / "metadata.json"));  // written again by the resumed run
}

// Ranks never choose the checkpoint to resume each on their own: rank 0 lists the folder and every
// rank loads its choice. Here rank 0's listing lags (it does not show steps 15 and 20 yet, as on a
// shared file system right after a commit) while the other ranks see them: all resume from step
// 10, rank 0's newest, rather than each from its own.
TEST_F(FaultTolerance, EveryRankResumesFromRankZerosChoice) {
  train_on(config("chosen", saving("disabled")), world());
  if (world().rank() == 0) {
    fs::copy(root() / "chosen" / "checkpoint", root() / "chosen" / "lagging", fs::copy_options::recursive);
    for (int step : {15, 20}) fs::remove_all(root() / "chosen" / "lagging" / ("step-" + std::to_string(step)));
  }
  world().barrier().wait();
  std::vector<std::string> view = saving("disabled");
  view.push_back(std::string("--checkpoint.folder=") + (world().rank() == 0 ? "lagging" : "checkpoint"));
  const train::Trainer resumed(config("chosen", view), "test", &world());
  EXPECT_EQ(dynamic_cast<const optim::AdamW&>(resumed.optimizer()).steps_taken(), 10) << "rank " << world().rank() << " resumed from its own listing";
}

// A NaN in one rank's gradient at step 7: every rank sees it before the update. "skip" drops the
// step's update; "rollback" reloads step 5 and replays, skipping step 7's batch, and ends the
// same to the last bit; "abort" ends the run naming the step and the rank.
TEST_F(FaultTolerance, NonFiniteStepsAreSkippedRolledBackOrAborted) {
  const int bad = world().size() - 1;
  const std::vector<std::string> inject = {"--fault.inject_nonfinite_at_step=7", "--fault.inject_rank=" + std::to_string(bad)};
  const auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto plain = train_on(config("clean"), world());
  train_on(config("skip", with(inject, {"--fault.on_nonfinite=skip"})), world());
  train_on(config("rollback", with(with(inject, {"--fault.on_nonfinite=rollback"}), saving("async"))), world());
  const auto skip = by_step("skip"), rollback = by_step("rollback");
  ASSERT_EQ(skip.size(), 20u);
  for (int64_t step = 1; step <= 7; ++step) EXPECT_EQ(skip.at(step), plain[size_t(step - 1)]) << step;
  EXPECT_NE(skip.at(8), plain[7]) << "step 7's update was not skipped";
  EXPECT_EQ(rollback, skip) << "a rollback ends as the run that skipped the step";
  const auto said = [](const std::vector<std::string>& ev, const std::string& needle) {
    return std::any_of(ev.begin(), ev.end(), [&](const std::string& e) { return e.find(needle) != std::string::npos; });
  };
  EXPECT_TRUE(said(events("skip"), "step 7 is not finite")) << "no event for the skipped step";
  EXPECT_TRUE(said(events("rollback"), "rolled back to")) << "no event for the rollback";
  const std::string e = error_of([&] { train_on(config("abort", inject), world()); });
  EXPECT_NE(e.find("step 7 is not finite"), std::string::npos) << e;
  EXPECT_NE(e.find("rank " + std::to_string(bad) + " (the gradient of"), std::string::npos) << e;
  const std::string none = error_of([&] { train_on(config("nothing_to_roll_back", with(inject, {"--fault.on_nonfinite=rollback"})), world()); });
  EXPECT_NE(none.find("no committed checkpoint"), std::string::npos) << none;
}

// A rank slower than the others (here: sleeping 0.3 s in every step) is named in the metrics: the
// spread of the ranks' busy seconds per step (not blocked on communication) and an event.
TEST_F(FaultTolerance, AStragglerIsNamed) {
  const int slow = world().size() - 1;
  train_on(config("straggler", {"--training.steps=4", "--fault.inject_step_delay_seconds=0.5",
                                "--fault.inject_rank=" + std::to_string(slow)}),
           world());
  const auto ev = events("straggler");
  const std::string needle = "straggler: rank " + std::to_string(slow) + " worked";
  EXPECT_TRUE(std::any_of(ev.begin(), ev.end(), [&](const std::string& e) { return e.find(needle) != std::string::npos; }))
      << "no event names rank " << slow;
  std::ifstream f(root() / "straggler" / "metrics.jsonl");
  int named = 0;
  for (std::string line; std::getline(f, line);)
    if (const auto j = nlohmann::json::parse(line); j["kind"] == "train")
      named += j["slowest_rank"].get<int>() == slow && j["rank_busy_spread"].get<double>() > 1.25;
  EXPECT_GE(named, 3) << "of 4 steps";  // (one step may see other noise on an oversubscribed host)
}

}  // namespace
