// Pipeline parallelism for DeepSeek: every schedule for deepseek_v32 (the DSA warm-up and sparse
// stages, MoE balancing per stage) and for deepseek_v4 (mHC's residual streams between stages),
// and DeepSeek-V3's and V4's MTP modules on the last stage.
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

// DeepSeek-V4: the hc_mult residual streams [tokens, 4, dim] cross each stage boundary, the first
// stage embeds and copies into them, the last collapses them (HyperHead) before the norm and head;
// each stage adds its CSA layers' indexer KL. The debug model's six layers split sliding, CSA, HCA |
// CSA, HCA, CSA over 2 stages, sliding | CSA, HCA | CSA, HCA | CSA over 4 (the V and interleaved
// schedules). Every schedule against one rank's run. (Hash layer 1 sits on the second of 4 stages,
// but a run from scratch has all-zero hash tables, which ignore the ids: unit/deepseek_v4_stages_test
// checks that the stages route by the ids they get.)
TEST_F(PipelineDeepSeek, EveryScheduleReproducesOneRankDeepSeekV4) {
  const int n = world().size();
  if (n != 2) GTEST_SKIP() << "on 2 ranks";
  const int64_t batch = 4;
  const auto one = reference_on_rank0(config("deepseek_v4", "reference", 1, 1, "1F1B", batch, {}, 1));
  const auto one_kl = losses_of(root() / "deepseek_v4_reference", "train", "indexer_loss");
  ASSERT_EQ(one_kl.size(), one.size()) << "the indexers' KL loss is on";
  for (const std::string& schedule : distributed::pp::schedule_names()) {
    const auto got = train_on(config("deepseek_v4", schedule, n, 1, schedule, batch), world());
    expect_same_losses(one, got, 0, "deepseek_v4 " + schedule);
    expect_same_losses(one_kl, losses_of(root() / ("deepseek_v4_" + schedule), "train", "indexer_loss"), 1e-12,
                       "deepseek_v4 " + schedule + ", indexer loss");
  }
}

// DeepSeek-V3 and V4 with an MTP module on the last stage, which shares the first stage's embedding: the V
// placement puts both on rank 0. A loop placement is refused, naming the schedules that work.
TEST_F(PipelineDeepSeek, MultiTokenPredictionOnTheLastStage) {
  const int n = world().size();
  if (n != 2) GTEST_SKIP() << "on 2 ranks";
  const int64_t batch = n == 2 ? 4 : 8;
  const std::vector<std::string> mtp = {"--model.mtp_layers=1"};
  for (const std::string model : {"deepseek_v3", "deepseek_v4"}) {
    const auto one = reference_on_rank0(config(model, "reference_mtp", 1, 1, "1F1B", batch, mtp, 1));
    const auto one_mtp = losses_of(root() / (model + "_reference_mtp"), "train", "mtp_loss");
    const auto got = train_on(config(model, "dualpipev_mtp", n, 1, "DualPipeV", batch, mtp), world());
    expect_same_losses(one, got, 0, model + " + MTP, DualPipeV");
    expect_same_losses(one_mtp, losses_of(root() / (model + "_dualpipev_mtp"), "train", "mtp_loss"), 0,
                       model + " + MTP, DualPipeV, MTP loss");
    const std::string e = error_of([&] { train::Trainer t(config(model, "1f1b_mtp", n, 1, "1F1B", batch, mtp), "test", &world()); });
    EXPECT_NE(e.find("DualPipeV"), std::string::npos) << e;
  }
}

}  // namespace
