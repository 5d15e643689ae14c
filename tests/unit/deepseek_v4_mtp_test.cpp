// DeepSeek-V4 multi-token prediction (models/deepseek_v4/mtp.h): the training loss against a
// composition written out here from the model's own pieces, the main loss and gradients of a model
// without MTP unchanged, the gradient against central differences and under recompute, the
// refusals, and a few training steps through `titan train` with --model.mtp_layers.
// tests/parity/deepseek_v4_parity_test.cpp checks the module against transformers' own classes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "common/byte_dataset.h"
#include "common/error_of.h"
#include "common/kernel_check.h"
#include "common/run_toml.h"
#include "titan/autograd/ops.h"
#include "titan/distributed/pipeline_stages.h"
#include "titan/models/deepseek_v4/mtp.h"
#include "titan/models/mtp_targets.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 2, kSeq = 12, kVocab = 32;

// Two sliding-window layers (one hash-routed), every expert active: routing then changes with no
// weight, so the loss is smooth for the central differences.
v4::DeepSeekV4Args tiny_args(int64_t mtp_layers, double weight = 0.3) {
  v4::DeepSeekV4Args a;
  a.vocab_size = kVocab, a.dim = 16, a.n_layers = 2, a.n_heads = 2, a.head_dim = 16, a.rope_dim = 4;
  a.q_lora_rank = 8, a.o_groups = 2, a.o_lora_rank = 4;
  a.n_routed_experts = 2, a.n_activated_experts = 2, a.moe_inter_dim = 8, a.hc_mult = 2, a.sliding_window = 8;
  a.max_seq_len = 32;
  a.layer_types = {v4::LayerType::sliding, v4::LayerType::sliding};
  a.mlp_types = {v4::MlpType::hash_moe, v4::MlpType::moe};
  a.num_mtp_layers = mtp_layers, a.mtp_loss_weight = weight;
  return a;
}

struct Batch {
  Tensor tokens = Tensor::empty({kBatch, kSeq}, DType::i32);
  Tensor targets = Tensor::empty({kBatch * kSeq}, DType::i32);
  Batch() {
    for (int64_t r = 0; r < kBatch; ++r)
      for (int64_t i = 0; i <= kSeq; ++i) {
        const int32_t t = int32_t((r * 11 + i * 5 + i * i) % kVocab);
        if (i < kSeq) tokens.data<int32_t>()[r * kSeq + i] = t;
        if (i > 0) targets.data<int32_t>()[r * kSeq + i - 1] = t;
      }
    targets.data<int32_t>()[5] = -100;
  }
};

std::unique_ptr<v4::Transformer> built(const v4::DeepSeekV4Args& a, uint64_t seed) {
  auto m = std::make_unique<v4::Transformer>(a);
  m->init_parameters(seed);
  return m;
}

// Copies every tensor of `to` that `from` has (by name).
void copy_shared(v4::Transformer& from, v4::Transformer& to) {
  std::map<std::string, Tensor> src;
  for (const auto& [name, p] : from.named_parameters()) src[name] = p->var.value();
  for (const auto& [name, p] : to.named_parameters())
    if (src.count(name)) p->var.mutable_value().copy_(src.at(name));
}

// The mean MTP loss written out from the model's pieces: the main streams, then per module
// e_proj(enorm(Emb(t_{i+k}))) in every stream + h_proj(hnorm(X)) -> block -> hc_head -> norm ->
// the shared head, cross-entropy against t_{i+k+1}.
double composed_mtp_loss(v4::Transformer& m, const Batch& b) {
  const int64_t t = kBatch * kSeq, n = m.args().hc_mult, d = m.args().dim;
  Tensor pos = Tensor::empty({kBatch, kSeq}, DType::i32);
  for (int64_t i = 0; i < t; ++i) pos.data<int32_t>()[i] = int32_t(i % kSeq);
  const auto emb = [&](const Tensor& ids) { return autograd::view(m.embed_tokens->forward(ids, DType::f32), {t, d}); };
  Variable x = v4::copy_into_streams(emb(b.tokens), n);
  for (size_t l = 0; l < m.layers.size(); ++l) x = m.layers[l].forward(x, pos, b.tokens.view({t}), m.sliding_rope(), nullptr);
  double sum = 0;
  for (int64_t k = 1; k <= int64_t(m.mtp->size()); ++k) {
    Tensor ids = Tensor::zeros({kBatch, kSeq}, DType::i32), labels = Tensor::full({t}, -100, DType::i32);
    for (int64_t r = 0; r < kBatch; ++r)
      for (int64_t i = 0; i + k < kSeq; ++i) {
        ids.data<int32_t>()[r * kSeq + i] = b.tokens.data<int32_t>()[r * kSeq + i + k];      // t_{i+k}
        labels.data<int32_t>()[r * kSeq + i] = b.targets.data<int32_t>()[r * kSeq + i + k];  // t_{i+k+1}
      }
    v4::MtpModule& mod = (*m.mtp)[size_t(k - 1)];
    const Variable e = mod.e_proj.forward(mod.enorm.forward(emb(ids)));
    const Variable h = mod.h_proj.forward(mod.hnorm.forward(x));  // each stream's row alone
    x = mod.v4::DecoderLayer::forward(autograd::add(v4::copy_into_streams(e, n), h), pos, ids.view({t}), m.sliding_rope(),
                                      nullptr);
    const Variable logits = m.lm_head->forward(mod.norm.forward(mod.hc_head.forward(x)));
    sum += autograd::cross_entropy(logits, labels).value().item();
  }
  return sum / double(m.mtp->size());
}

double term(const models::TrainingLoss& l, const std::string& name) {
  for (const auto& [n, v] : l.terms)
    if (n == name) return v;
  ADD_FAILURE() << "no term " << name;
  return 0;
}

}  // namespace

TEST(DeepSeekV4Mtp, LossMatchesTheComposition) {
  const Batch b;
  for (int64_t depth : {1, 2}) {
    auto m = built(tiny_args(depth), 7);
    ASSERT_NE(m->mtp, nullptr);
    EXPECT_EQ(m->loss_term_names(), std::vector<std::string>{"mtp_loss"});
    const models::TrainingLoss got = m->training_loss(b.tokens, b.targets);
    autograd::NoGradGuard no_grad;
    const double mean = composed_mtp_loss(*m, b);
    EXPECT_NEAR(term(got, "mtp_loss"), mean, 1e-5) << "D = " << depth;
    EXPECT_NEAR(got.total.value().item(), got.cross_entropy + 0.3 * mean, 1e-5) << "D = " << depth;
    EXPECT_NEAR(mean, std::log(double(kVocab)), 0.5);  // an untrained head: about chance
    // Evaluation and generation run the main model alone.
    EXPECT_NEAR(m->evaluation_loss(b.tokens, b.targets), got.cross_entropy, 1e-6);
  }
}

// A model without MTP is the model it was: no mtp.* tensors, no term, and the main loss and every
// gradient of a model with MTP at weight 0 equal to it.
TEST(DeepSeekV4Mtp, ZeroLayersLeaveTheModelUnchanged) {
  const Batch b;
  auto plain = built(tiny_args(0), 5);
  auto with = built(tiny_args(1, 0.0), 5);
  copy_shared(*plain, *with);
  EXPECT_EQ(plain->mtp, nullptr);
  EXPECT_TRUE(plain->loss_term_names().empty());
  for (const auto& [name, p] : plain->named_parameters()) EXPECT_FALSE(name.starts_with("mtp.")) << name;
  // One forward and backward at a time: a backward consumes the graph recorded so far.
  const models::TrainingLoss lp = plain->training_loss(b.tokens, b.targets);
  Variable tp = lp.total;
  autograd::backward(tp);
  const models::TrainingLoss lw = with->training_loss(b.tokens, b.targets);
  Variable tw = lw.total;
  autograd::backward(tw);
  EXPECT_TRUE(lp.terms.empty());
  EXPECT_EQ(lp.cross_entropy, lw.cross_entropy);
  EXPECT_EQ(lp.total.value().item(), lw.total.value().item());
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : with->named_parameters()) grads[name] = p->var.grad();
  for (const auto& [name, p] : plain->named_parameters()) {
    if (!p->var.grad().defined()) continue;
    ASSERT_TRUE(grads.at(name).defined()) << name;
    EXPECT_EQ(test::to_doubles(p->var.grad()), test::to_doubles(grads.at(name))) << name;
  }
}

// d(training loss)/d(weight) against central differences for weights of every part the MTP path
// reaches: the module's own, its block's, the shared embedding and head, a main layer (through
// X^0). f32 throughout, so the step is large and the tolerance loose.
TEST(DeepSeekV4Mtp, GradientMatchesFiniteDifferences) {
  const Batch b;
  auto m = built(tiny_args(2), 13);
  m->zero_grad();
  Variable loss = m->training_loss(b.tokens, b.targets).total;
  autograd::backward(loss);
  const std::vector<std::string> names = {
      "mtp.0.e_proj.weight",          "mtp.0.h_proj.weight",      "mtp.0.enorm.weight",
      "mtp.0.hnorm.weight",           "mtp.0.hc_head.fn",         "mtp.0.hc_head.base",
      "mtp.1.hc_head.scale",          "mtp.1.norm.weight",        "mtp.0.attn_hc.fn",
      "mtp.1.self_attn.q_a_proj.weight", "mtp.1.self_attn.sinks", "mtp.0.mlp.experts.w1",
      "mtp.1.mlp.router.gate.weight", "mtp.0.ffn_hc.base",        "embed_tokens.weight",
      "lm_head.weight",               "layers.1.self_attn.kv_proj.weight"};
  std::map<std::string, nn::Parameter*> params;
  for (auto& [n, p] : m->named_parameters()) params[n] = p;
  const double eps = 1e-2;
  for (const std::string& name : names) {
    ASSERT_TRUE(params.count(name)) << name;
    nn::Parameter& p = *params[name];
    const Tensor grad = p.var.grad();
    ASSERT_TRUE(grad.defined()) << name;
    float* w = p.var.value().data<float>();
    const int64_t numel = p.var.value().numel();
    for (int64_t j = 0; j < numel; j += std::max<int64_t>(1, numel / 4)) {
      const float keep = w[j];
      autograd::NoGradGuard no_grad;
      w[j] = keep + float(eps);
      const double up = m->training_loss(b.tokens, b.targets).total.value().item();
      w[j] = keep - float(eps);
      const double down = m->training_loss(b.tokens, b.targets).total.value().item();
      w[j] = keep;
      const double fd = (up - down) / (2 * eps), an = grad.data<float>()[j];
      EXPECT_NEAR(an, fd, 3e-4 + 3e-2 * std::abs(fd)) << name << "[" << j << "]";
    }
  }
}

// Activation recompute (full and selective) covers the MTP blocks too, with the same gradients.
TEST(DeepSeekV4Mtp, RecomputeGivesTheSameGradients) {
  const Batch b;
  std::vector<std::map<std::string, std::vector<double>>> grads;
  for (models::Recompute rc : {models::Recompute::none, models::Recompute::full, models::Recompute::selective}) {
    auto m = built(tiny_args(2), 9);
    m->set_recompute(rc);
    Variable loss = m->training_loss(b.tokens, b.targets).total;
    autograd::backward(loss);
    grads.emplace_back();
    for (auto& [name, p] : m->named_parameters())
      if (p->var.grad().defined()) grads.back()[name] = test::to_doubles(p->var.grad());
  }
  for (size_t r : {1, 2}) {
    ASSERT_EQ(grads[0].size(), grads[r].size());
    for (const auto& [name, g] : grads[0]) EXPECT_EQ(g, grads[r].at(name)) << name << ", recompute " << r;
  }
}

// Under bf16 mixed precision the module's GEMMs (e_proj, h_proj, its block's, the shared head)
// read bf16 copies: its loss moves off the f32 one by bf16 rounding, not more.
TEST(DeepSeekV4Mtp, Bf16MixedPrecisionRunsTheModuleInBf16) {
  const Batch b;
  auto m = built(tiny_args(1), 21);
  const double f32 = term(m->training_loss(b.tokens, b.targets), "mtp_loss");
  m->set_compute_dtype(DType::bf16);
  EXPECT_TRUE((*m->mtp)[0].e_proj.weight.compute.defined());
  const models::TrainingLoss bf16 = m->training_loss(b.tokens, b.targets);
  const double err = std::fabs(term(bf16, "mtp_loss") - f32) / f32;
  EXPECT_GT(err, 1e-7) << "the bf16 GEMMs did not run";
  EXPECT_LT(err, 1e-2);
  Variable total = bf16.total;
  autograd::backward(total);
  EXPECT_TRUE((*m->mtp)[0].h_proj.weight.var.grad().defined());
}

// The analytic count of the modules' own weights (apart from the model's, as V3's) is what the
// model holds under mtp.*, and the FLOP count (for MFU) grows by them, the head and h_proj per stream.
TEST(DeepSeekV4Mtp, CountsItsParametersAndFlopsApart) {
  for (int64_t depth : {1, 2}) {
    const v4::DeepSeekV4Args a = tiny_args(depth);
    v4::Transformer m(a);
    int64_t held = 0, main = 0;
    for (const auto& [name, p] : m.named_parameters()) (name.starts_with("mtp.") ? held : main) += p->var.value().numel();
    EXPECT_EQ(a.parameters().mtp, held) << "D = " << depth;
    EXPECT_EQ(a.parameters().total, main) << "D = " << depth;
    v4::Transformer plain(tiny_args(0));
    const double d = double(a.dim), extra = m.training_flops_per_token(kSeq) - plain.training_flops_per_token(kSeq);
    const double attention = 6.0 * double(a.n_heads) * 2 * double(a.head_dim) * double(a.sliding_window);  // per module
    EXPECT_NEAR(extra,
                double(depth) * (6 * (double(a.parameters().mtp_active) / double(depth) + double(a.vocab_size) * d +
                                      double(a.hc_mult - 1) * d * d) + attention),
                1e-6 * extra);
  }
}

TEST(DeepSeekV4Mtp, RefusesWhatItCannotRun) {
  EXPECT_NE(test::error_of([] { tiny_args(-1).validate(); }).find("model.mtp_layers = -1"), std::string::npos);
  EXPECT_NE(test::error_of([] { tiny_args(1, -0.5).validate(); }).find("mtp_loss_weight"), std::string::npos);
  EXPECT_NE(test::error_of([] { tiny_args(2).validate_sequence(2); }).find("training.seq_len = 2"), std::string::npos);
  // The last pipeline stage without the first (a loop placement) has no embedding for MTP.
  const std::vector<distributed::pp::StageLayers> stages = distributed::pp::split_stages(2, 2);
  const std::string pp = test::error_of([&] { v4::Transformer m(tiny_args(1), {stages[1]}); });
  EXPECT_NE(pp.find("DualPipeV"), std::string::npos) << pp;
  EXPECT_NO_THROW(v4::Transformer(tiny_args(1), {stages[0], stages[1]}));
  auto m = built(tiny_args(3), 1);
  const Batch b;
  const Tensor short_tokens = b.tokens.slice(1, 0, 3).contiguous();
  Tensor short_targets = Tensor::zeros({kBatch * 3}, DType::i32);
  EXPECT_NE(test::error_of([&] { m->training_loss(short_tokens, short_targets); }).find("leaves no target"), std::string::npos);
}

// A few steps of `titan train` with --model.mtp_layers = 1: the MTP loss logged each step, both
// losses falling, the module's weights trained.
TEST(DeepSeekV4Mtp, TrainsThroughTheTrainer) {
  const fs::path root = fs::temp_directory_path() / ("titan_v4_mtp_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = test::prepare_words_dataset(root / "data");
  const std::string toml = "[job]\ndump_folder = \"" + (root / "run").string() +
                           "\"\n[model]\nname = \"deepseek_v4\"\nflavor = \"debugmodel\"\nmtp_layers = 1\n"
                           "[training]\nlocal_batch_size = 2\nseq_len = 48\nsteps = 6\ndataset_path = \"" +
                           data.string() +
                           "\"\nmixed_precision_param = \"float32\"\n[optimizer]\nlr = 2e-3\n[lr_scheduler]\n"
                           "warmup_steps = 1\n[checkpoint]\nenable = false\n[metrics]\nlog_freq = 1\n"
                           "[validation]\nenable = false\n";
  train::Trainer trainer(train::parse_config(toml, "mtp.toml"), "mtp.toml");
  std::map<std::string, Tensor> initial;
  for (auto& [name, t] : trainer.model().state_dict())
    if (name.starts_with("mtp.")) initial[name] = t.clone();
  EXPECT_GT(initial.size(), 20u);
  EXPECT_EQ(trainer.train().last_step, 6);
  const std::vector<double> loss = test::losses_of(root / "run"), mtp = test::losses_of(root / "run", "train", "mtp_loss");
  ASSERT_EQ(loss.size(), 6u);
  ASSERT_EQ(mtp.size(), 6u);
  EXPECT_LT(mtp.back(), mtp.front() - 0.3);
  EXPECT_LT(loss.back(), loss.front() - 0.3);
  for (auto& [name, t] : trainer.model().state_dict()) {
    if (initial.count(name) && !name.ends_with("tokens_per_expert")) {
      EXPECT_NE(test::to_doubles(t), test::to_doubles(initial[name])) << name << " did not train";
    }
  }
  fs::remove_all(root);
}
