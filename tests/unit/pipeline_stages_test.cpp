// TorchTitan's split of the blocks into pipeline stages: the embedding and the head count as
// blocks, the remainder goes to the first stages, and a split that leaves a stage empty is
// refused with the most stages that work.
#include <gtest/gtest.h>

#include "titan/core/error.h"
#include "titan/distributed/pipeline_stages.h"

using namespace titan;
using namespace titan::distributed::pp;

namespace {

std::vector<std::pair<int, int>> ranges(const std::vector<StageLayers>& s) {
  std::vector<std::pair<int, int>> out;
  for (const StageLayers& st : s) out.emplace_back(st.begin, st.end);
  return out;
}

TEST(PipelineStages, TheEmbeddingAndTheHeadCountAsBlocks) {
  using R = std::vector<std::pair<int, int>>;
  // 6 blocks + 2 = 8 effective layers over 2 stages: 3 blocks and the embedding, 3 and the head.
  EXPECT_EQ(ranges(split_stages(6, 2)), (R{{0, 3}, {3, 6}}));
  // Over 4 stages: 1 + embedding, 2, 2, 1 + head.
  const auto four = split_stages(6, 4);
  EXPECT_EQ(ranges(four), (R{{0, 1}, {1, 3}, {3, 5}, {5, 6}}));
  EXPECT_TRUE(four[0].embedding && !four[0].head && four[3].head && !four[3].embedding);
  // 7 blocks + 2 = 9 over 4: the first stage takes the extra layer.
  EXPECT_EQ(ranges(split_stages(7, 4)), (R{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  // Without the less-layers counts the blocks split evenly.
  EXPECT_EQ(ranges(split_stages(6, 3, 0, 0)), (R{{0, 2}, {2, 4}, {4, 6}}));
  // As many stages as effective layers: the embedding and the head alone on theirs.
  EXPECT_EQ(ranges(split_stages(2, 4)), (R{{0, 0}, {0, 1}, {1, 2}, {2, 2}}));
  // Every block exactly once, in order, for many shapes.
  for (int n = 1; n <= 12; ++n)
    for (int stages = 1; stages <= n + 2; ++stages) {
      const auto s = split_stages(n, stages);
      int next = 0;
      for (const StageLayers& st : s) {
        EXPECT_EQ(st.begin, next);
        next = st.end;
      }
      EXPECT_EQ(next, n) << n << " blocks, " << stages << " stages";
    }
}

TEST(PipelineStages, MoreStagesThanLayersAreRefused) {
  try {
    split_stages(6, 9);
    FAIL() << "9 stages for 6 blocks";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("9 pipeline stages for a model of 6 blocks"), std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("use at most 8 stages"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(split_stages(2, 5, 3, 0), Error);  // stage 1 would hold nothing
  EXPECT_THROW(split_stages(4, 2, -1, 1), Error);
}

}  // namespace
