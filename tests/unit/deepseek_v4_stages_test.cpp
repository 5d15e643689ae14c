// DeepSeek-V4 split into pipeline stages (models/deepseek_v4/model.h), on one rank: the debug
// model's four stage models at PP 2 under a V schedule (embedding + sliding | CSA, HCA | CSA, HCA |
// CSA + head), each fed the previous one's residual streams [tokens, hc_mult, dim], give the whole
// model's cross-entropy, indexer loss and every parameter's gradient. The hash layers' tables are
// random here (a run from scratch has them all zero: every token on expert 0, whatever its id), so
// layer 1, on the second stage, routes by the token ids that stage was given.
// distributed/pipeline_deepseek_test.cpp runs the schedules themselves against one rank's training.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/distributed/pipeline_stages.h"
#include "titan/models/deepseek_v4/model.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr int64_t kVocab = 64, kBatch = 2, kSeq = 64;

// Every hash layer's tid2eid: distinct experts per token, spread over all of them.
void randomize_hash_tables(v4::Transformer& m) {
  for (size_t l = 0; l < m.layers.size(); ++l) {
    Tensor& table = m.layers[l].mlp.tid2eid;
    if (!table.defined()) continue;
    const int64_t experts = m.args().n_routed_experts, k = table.size(1);
    for (int64_t t = 0; t < table.size(0); ++t)
      for (int64_t j = 0; j < k; ++j) table.data<int64_t>()[t * k + j] = (t * 5 + j * 3 + int64_t(l)) % experts;
  }
}

// Copies the parameters and state buffers `part` holds from `whole` (by their global names).
void copy_state(v4::Transformer& whole, v4::Transformer& part) {
  std::map<std::string, Tensor> from;
  for (const auto& [name, p] : whole.named_parameters()) from[name] = p->var.value();
  for (const auto& [name, t] : whole.named_buffers(nn::BufferKind::state)) from[name] = t;
  for (const auto& [name, p] : part.named_parameters()) p->var.mutable_value().copy_(from.at(name));
  for (auto& [name, t] : part.named_buffers(nn::BufferKind::state)) t.copy_(from.at(name));
}

Tensor tokens_of_sequence() {
  Tensor t = Tensor::empty({kBatch, kSeq}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = int32_t((i * 37 + i / 7) % kVocab);
  return t;
}

Tensor next_tokens(const Tensor& tokens) {
  Tensor out = Tensor::empty({kBatch * kSeq}, DType::i32);
  for (int64_t r = 0; r < kBatch; ++r)
    for (int64_t s = 0; s < kSeq; ++s)
      out.data<int32_t>()[r * kSeq + s] = s + 1 < kSeq ? tokens.data<int32_t>()[r * kSeq + s + 1] : -100;
  return out;
}

}  // namespace

TEST(DeepSeekV4Stages, StagesInSequenceAreTheWholeModel) {
  v4::DeepSeekV4Args a = v4::deepseek_v4_flavor("debugmodel", kVocab);
  a.index_topk = 4;  // of the 16 compressed entries of a CSA layer: a real selection
  v4::Transformer whole(a);
  whole.init_parameters(11);
  randomize_hash_tables(whole);
  whole.set_indexer_loss_coeff(0.01);
  const Tensor tokens = tokens_of_sequence(), targets = next_tokens(tokens);

  const models::TrainingLoss one = whole.training_loss(tokens, targets);
  Variable total = one.total;
  autograd::backward(total);

  const std::vector<distributed::pp::StageLayers> stages = distributed::pp::split_stages(int(a.n_layers), 4);
  ASSERT_EQ(stages[1].begin, 1) << "the second stage starts at hash layer 1";
  std::vector<std::unique_ptr<v4::Transformer>> parts;
  Variable h, sum;
  double cross_entropy = 0, indexer = 0;
  int indexer_terms = 0;
  for (const distributed::pp::StageLayers& st : stages) {
    parts.push_back(std::make_unique<v4::Transformer>(a, std::vector{st}));
    v4::Transformer& part = *parts.back();
    EXPECT_EQ(part.layers.size(), size_t(st.end - st.begin));
    EXPECT_EQ(part.embed_tokens != nullptr, st.embedding);
    EXPECT_EQ(part.lm_head != nullptr && part.hc_head != nullptr && part.norm != nullptr, st.head);
    copy_state(whole, part);
    part.set_indexer_loss_coeff(0.01);
    const models::StageOutput o = part.stage_forward(st, h, tokens, targets);
    if (!st.head) {
      EXPECT_EQ(o.hidden.shape(), part.stage_activation_shape(kBatch, kSeq));
    }
    h = o.hidden;
    cross_entropy += o.cross_entropy;
    for (size_t k = 0; k < o.term_sums.size(); ++k) {
      ASSERT_EQ(o.term_sums[k].first, "indexer_loss");
      indexer += o.term_sums[k].second, indexer_terms += o.term_counts[k];
    }
    if (o.loss.defined()) sum = sum.defined() ? autograd::add(sum, o.loss) : o.loss;
  }
  EXPECT_EQ(cross_entropy, one.cross_entropy);
  EXPECT_EQ(indexer_terms, 3) << "the three CSA layers";
  ASSERT_EQ(one.terms.size(), 1u);
  EXPECT_DOUBLE_EQ(indexer / indexer_terms, one.terms[0].second);
  autograd::backward(sum);

  std::map<std::string, Tensor> want;
  for (const auto& [name, p] : whole.named_parameters()) want[name] = p->var.grad();
  size_t checked = 0;
  for (const auto& part : parts)
    for (const auto& [name, p] : part->named_parameters()) {
      ASSERT_TRUE(want.at(name).defined()) << name;
      ASSERT_TRUE(p->var.grad().defined()) << name;
      EXPECT_EQ(test::relative_error(p->var.grad(), want.at(name)), 0.0) << name;
      ++checked;
    }
  EXPECT_EQ(checked, want.size()) << "every parameter on exactly one stage";
}
