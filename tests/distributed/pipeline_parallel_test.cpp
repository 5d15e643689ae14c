// Every pipeline schedule reproduces the 1-rank run over 20 steps, to the last bit: the local batch
// of 4 (8 on 4 ranks) sequences runs as micro-batches of one, against rank 0 alone accumulating
// the same micro-batches. Each micro-batch computes the same numbers on either; the pipeline keeps
// each micro-batch's gradients apart and sums them as one rank does (train/pipeline_step.cpp),
// the zero-bubble schedules' deferred weight gradients included.
#include "distributed/common.h"

#include "titan/distributed/pipeline_schedule.h"

using namespace titan;
using namespace titan::test;

namespace {

class PipelineLayouts : public TrainingSuite<PipelineLayouts> {
 public:
  static constexpr const char* kTag = "pipeline";

 protected:
  static train::JobConfig config(const std::string& model, const std::string& name, int64_t pp, int64_t tp,
                                 const std::string& schedule, int64_t batch, const std::vector<std::string>& extra = {},
                                 int64_t local_batch = 0) {
    std::string toml = base_toml(model, data(), root() / (model + "_" + name), 20);
    toml += "[parallelism]\ndata_parallel_shard_degree = 1\npipeline_parallel_degree = " + std::to_string(pp) +
            "\ntensor_parallel_degree = " + std::to_string(tp) + "\npipeline_parallel_schedule = \"" + schedule +
            "\"\npipeline_parallel_microbatch_size = 1\n";
    train::JobConfig cfg = train::parse_config(toml, name + ".toml", extra);
    cfg.training.local_batch_size = local_batch > 0 ? local_batch : batch;
    cfg.training.global_batch_size = batch;
    return cfg;
  }
};

// The pipeline's losses within 1e-5 of the reference's.
constexpr double kTolerance = 0;

TEST_F(PipelineLayouts, EveryScheduleReproducesOneRankLlama3) {
  const int n = world().size();
  const int64_t batch = n == 2 ? 4 : 8;
  const auto validation = validation_every_10(batch);
  const auto one = reference_on_rank0(config("llama3", "reference", 1, 1, "1F1B", batch, validation, 1));
  const auto one_val = losses_of(root() / "llama3_reference", "validation");
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    const auto got = train_on(config("llama3", schedule, n, 1, schedule, batch, validation), world());
    expect_same_losses(one, got, kTolerance, schedule + " over " + std::to_string(n) + " stages' ranks");
    expect_same_losses(one_val, losses_of(root() / ("llama3_" + schedule), "validation"), kTolerance,
                       schedule + ", validation loss");
  }
}

// DeepSeek-V3.2: its dense warm-up (indexers only: no gradient crosses the stages) for 3 steps,
// then the sparse stage; MoE balancing from the step's expert loads; the indexer KL on the stages
// that hold each layer. Every schedule, over 2 or 4 pipeline ranks.
TEST_F(PipelineLayouts, EveryScheduleReproducesOneRankDeepSeekV32) {
  const int n = world().size();
  const int64_t batch = n == 2 ? 4 : 8;
  const auto one = reference_on_rank0(config("deepseek_v32", "reference", 1, 1, "1F1B", batch, {}, 1));
  const auto one_kl = losses_of(root() / "deepseek_v32_reference", "train", "indexer_loss");
  // On 4 ranks (each schedule ran on 2), the two that place several stages per rank.
  const std::vector<std::string> schedules =
      n == 2 ? distributed::pp::schedule_names() : std::vector<std::string>{"Interleaved1F1B", "DualPipeV"};
  for (const std::string& schedule : schedules) {
    const auto got = train_on(config("deepseek_v32", schedule, n, 1, schedule, batch), world());
    expect_same_losses(one, got, kTolerance, "deepseek_v32 " + schedule);
    expect_same_losses(one_kl, losses_of(root() / ("deepseek_v32_" + schedule), "train", "indexer_loss"), 1e-12,
                       "deepseek_v32 " + schedule + ", indexer loss");
  }
}

// DeepSeek-V3 with an MTP module on the last stage, which shares the first stage's embedding: the V
// placement puts both on rank 0. A loop placement is refused, naming the schedules that work.
TEST_F(PipelineLayouts, MultiTokenPredictionOnTheLastStage) {
  const int n = world().size();
  if (n != 2) GTEST_SKIP() << "on 2 ranks";
  const int64_t batch = n == 2 ? 4 : 8;
  const std::vector<std::string> mtp = {"--model.mtp_layers=1"};
  const auto one = reference_on_rank0(config("deepseek_v3", "reference_mtp", 1, 1, "1F1B", batch, mtp, 1));
  const auto one_mtp = losses_of(root() / "deepseek_v3_reference_mtp", "train", "mtp_loss");
  const auto got = train_on(config("deepseek_v3", "dualpipev_mtp", n, 1, "DualPipeV", batch, mtp), world());
  expect_same_losses(one, got, kTolerance, "deepseek_v3 + MTP, DualPipeV");
  expect_same_losses(one_mtp, losses_of(root() / "deepseek_v3_dualpipev_mtp", "train", "mtp_loss"), kTolerance,
                     "deepseek_v3 + MTP, DualPipeV, MTP loss");
  const std::string e = error_of([&] { train::Trainer t(config("deepseek_v3", "1f1b_mtp", n, 1, "1F1B", batch, mtp), "test", &world()); });
  EXPECT_NE(e.find("DualPipeV"), std::string::npos) << e;
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

}  // namespace
