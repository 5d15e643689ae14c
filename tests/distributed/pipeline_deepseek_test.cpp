// Pipeline parallelism for DeepSeek: every schedule for deepseek_v32 (the DSA warm-up and sparse
// stages, MoE balancing per stage), and DeepSeek-V3's MTP modules on the last stage.
#include "distributed/pipeline_common.h"

using namespace titan;
using namespace titan::test;

namespace {

class PipelineDeepSeek : public PipelineSuite<PipelineDeepSeek> {
 public:
  static constexpr const char* kTag = "pipeline_deepseek";
};

// DeepSeek-V3.2: its dense warm-up (indexers only: no gradient crosses the stages) for 3 steps,
// then the sparse stage; MoE balancing from the step's expert loads; the indexer KL on the stages
// that hold each layer. Every schedule, over 2 or 4 pipeline ranks.
TEST_F(PipelineDeepSeek, EveryScheduleReproducesOneRankDeepSeekV32) {
  const int n = world().size();
  const int64_t batch = n == 2 ? 4 : 8;
  const auto one = reference_on_rank0(config("deepseek_v32", "reference", 1, 1, "1F1B", batch, {}, 1));
  const auto one_kl = losses_of(root() / "deepseek_v32_reference", "train", "indexer_loss");
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    const auto got = train_on(config("deepseek_v32", schedule, n, 1, schedule, batch), world());
    expect_same_losses(one, got, 0, "deepseek_v32 " + schedule);
    expect_same_losses(one_kl, losses_of(root() / ("deepseek_v32_" + schedule), "train", "indexer_loss"), 1e-12,
                       "deepseek_v32 " + schedule + ", indexer loss");
  }
}

// DeepSeek-V3 with an MTP module on the last stage, which shares the first stage's embedding: the V
// placement puts both on rank 0. A loop placement is refused, naming the schedules that work.
TEST_F(PipelineDeepSeek, MultiTokenPredictionOnTheLastStage) {
  const int n = world().size();
  if (n != 2) GTEST_SKIP() << "on 2 ranks";
  const int64_t batch = n == 2 ? 4 : 8;
  const std::vector<std::string> mtp = {"--model.mtp_layers=1"};
  const auto one = reference_on_rank0(config("deepseek_v3", "reference_mtp", 1, 1, "1F1B", batch, mtp, 1));
  const auto one_mtp = losses_of(root() / "deepseek_v3_reference_mtp", "train", "mtp_loss");
  const auto got = train_on(config("deepseek_v3", "dualpipev_mtp", n, 1, "DualPipeV", batch, mtp), world());
  expect_same_losses(one, got, 0, "deepseek_v3 + MTP, DualPipeV");
  expect_same_losses(one_mtp, losses_of(root() / "deepseek_v3_dualpipev_mtp", "train", "mtp_loss"), 0,
                     "deepseek_v3 + MTP, DualPipeV, MTP loss");
  const std::string e = error_of([&] { train::Trainer t(config("deepseek_v3", "1f1b_mtp", n, 1, "1F1B", batch, mtp), "test", &world()); });
  EXPECT_NE(e.find("DualPipeV"), std::string::npos) << e;
}

}  // namespace
