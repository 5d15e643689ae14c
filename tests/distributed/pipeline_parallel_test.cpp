// Pipeline parallelism for llama3: every schedule against one rank, and the stage split's errors.
#include "distributed/pipeline_common.h"
#include "titan/distributed/comm_engine.h"
#include "titan/distributed/pipeline_executor.h"

using namespace titan;
using namespace titan::test;

namespace {

// 260 byte-level tokens: a vocabulary TP 2 divides.
class PipelineLayouts : public PipelineSuite<PipelineLayouts, 260> {
 public:
  static constexpr const char* kTag = "pipeline";
};

TEST_F(PipelineLayouts, EveryScheduleReproducesOneRankLlama3) {
  const int n = world().size();
  const int64_t batch = n == 2 ? 4 : 8;
  const auto validation = validation_every_10(batch);
  const auto one = reference_on_rank0(config("llama3", "reference", 1, 1, "1F1B", batch, validation, 1));
  const auto one_val = losses_of(root() / "llama3_reference", "validation");
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    const auto got = train_on(config("llama3", schedule, n, 1, schedule, batch, validation), world());
    expect_same_losses(one, got, 0, schedule + " over " + std::to_string(n) + " stages' ranks");
    expect_same_losses(one_val, losses_of(root() / ("llama3_" + schedule), "validation"), 0,
                       schedule + ", validation loss");
  }
}

// The default in-place sum (each backward adding into one gradient per parameter, in the schedule's
// order) reproduces one rank to rounding, every schedule.
TEST_F(PipelineLayouts, InPlaceGradientSumReproducesOneRankLlama3) {
  if (world().size() != 2) GTEST_SKIP() << "on 2 ranks (the schedules' orders are the same kind on 4)";
  const int64_t batch = 4;
  const auto one = reference_on_rank0(config("llama3", "reference_in_place", 1, 1, "1F1B", batch, {}, 1));
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    const auto got = train_on(config("llama3", schedule + "_in_place", 2, 1, schedule, batch,
                                     {"--parallelism.pipeline_parallel_gradient_sum=in_place"}),
                              world());
    expect_same_losses(one, got, 1e-5, schedule + ", gradients summed in place");
  }
}

// A pipeline run's checkpoint holds every stage's tensors (each rank writes its own): resumed
// under the same layout, or on one rank whole, training continues exactly as the run did.
TEST_F(PipelineLayouts, CheckpointsResumeUnderThePipelineAndOnOneRank) {
  if (world().size() != 2) GTEST_SKIP() << "on 2 ranks";
  const std::vector<std::string> ckpt = {"--checkpoint.enable=true", "--checkpoint.interval=10",
                                         "--checkpoint.keep_latest_k=0", "--checkpoint.last_save_model_only=false"};
  const auto whole = train_on(config("llama3", "ckpt_run", 2, 1, "DualPipeV", 4, ckpt), world());
  const fs::path step10 = root() / "llama3_ckpt_run" / "checkpoint" / "step-10";
  ASSERT_TRUE(fs::exists(step10)) << step10;
  std::vector<std::string> resume = {"--checkpoint.enable=true", "--checkpoint.initial_load_path=" + step10.string(),
                                     "--checkpoint.initial_load_model_only=false"};
  const auto later = [&](const std::vector<double>& l) { return std::vector<double>(l.end() - 10, l.end()); };
  const auto pp = train_on(config("llama3", "ckpt_resumed_pp", 2, 1, "1F1B", 4, resume), world());
  expect_same_losses(later(whole), pp, 0, "resumed under PP 2 (1F1B) from DualPipeV's step 10");
  const auto one = reference_on_rank0(config("llama3", "ckpt_resumed_one", 1, 1, "1F1B", 4, resume, 1));
  expect_same_losses(later(whole), one, 0, "resumed on one rank from PP 2's step 10");
}

// More stages than effective layers is refused on every rank alike, naming the config and the
// most stages that work (llama3 debug: 6 blocks, and no allowance for the embedding or head here).
TEST_F(PipelineLayouts, MoreStagesThanLayersIsAClearError) {
  if (world().size() != 4) GTEST_SKIP() << "8 stages need 4 ranks of 2";
  const std::string e = error_of([&] {
    train::Trainer t(config("llama3", "too_many_stages", 4, 1, "Interleaved1F1B", 8,
                            {"--parallelism.pipeline_parallel_first_stage_less_layers=0",
                             "--parallelism.pipeline_parallel_last_stage_less_layers=0"}),
                     "stages.toml", &world());
  });
  EXPECT_NE(e.find("stages.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("8 pipeline stages for a model of 6 blocks"), std::string::npos) << e;
  EXPECT_EQ(e.find("stages.toml: stages.toml"), std::string::npos) << e;
}

// Point to point, each activation and each gradient crosses between ranks once: per step a rank
// sends, for every stage boundary whose two stages sit on different ranks, m activations (the
// boundary's first stage is its own) or m input gradients (the second is), and nothing for the
// V turn, which passes in memory. Measured against that minimum for every schedule.
TEST_F(PipelineLayouts, PointToPointBytesAreTheAnalyticMinimum) {
  if (world().size() != 2) GTEST_SKIP() << "on 2 ranks";
  auto& engine = distributed::CommEngine::get();
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    train::JobConfig cfg = config("llama3", schedule + "_p2p", 2, 1, schedule, 4);
    engine.reset_stats();
    int64_t want = 0;
    {
      train::Trainer t(cfg, "test", &world());
      t.train();
      const distributed::pp::Schedule& sc = t.pipeline_executor()->schedule();
      int64_t dim = 0;
      for (const auto& [name, p] : t.model().named_parameters())
        if (name.ends_with("attention_norm.weight")) dim = p->var.value().numel();
      const int64_t activation = cfg.parallelism.pipeline_parallel_microbatch_size * cfg.training.seq_len * dim * 4;
      for (int s = 0; s + 1 < sc.stages(); ++s) {
        const int from = sc.rank_of(s), to = sc.rank_of(s + 1);
        if (from == to) continue;
        want += (from == world().rank()) + (to == world().rank());  // the activation, the gradient back
      }
      want *= int64_t(sc.microbatches) * cfg.training.steps * activation;
      // The last step's timeline (what bench_pipeline --timeline reads): actions in order, in the step.
      const distributed::pp::ExecutorTimes& times = t.pipeline_executor()->times();
      ASSERT_EQ(times.action_start.size(), sc.actions[size_t(world().rank())].size()) << schedule;
      for (size_t i = 1; i < times.action_start.size(); ++i)
        EXPECT_GE(times.action_start[i], times.action_start[i - 1]) << schedule << " action " << i;
      EXPECT_GE(times.action_start.front(), 0.0) << schedule;
      EXPECT_LE(times.action_start.back() + times.action_seconds.back(), times.total) << schedule;
    }
    int64_t sent = 0;
    for (const auto& [key, st] : engine.stats())
      if (key.first == "pp" && key.second == distributed::CommOp::send) sent += st.bytes;
    EXPECT_EQ(sent, want) << schedule << " on rank " << world().rank();
  }
}

}  // namespace
