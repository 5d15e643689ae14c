// DeepSeek-V3 multi-token prediction (mtp.h): the loss against a composition written out here
// from the model's own pieces, its gradient against finite differences (and under recompute),
// the argument checks,
// the Hugging Face names both ways (with the MTP layer's shared copies), and a few training steps
// through `titan train` with the key that turns it on.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"
#include <unistd.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/hf.h"
#include "titan/data/prepare.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/deepseek_v3/mtp.h"
#include "titan/models/mtp_targets.h"
#include "titan/train/trainer.h"

using namespace titan;
using namespace titan::models::deepseek_v3;
using autograd::Variable;
namespace fs = std::filesystem;

namespace {

DeepSeekV3Args tiny_args(int64_t mtp_layers) {
  DeepSeekV3Args a;
  a.vocab_size = 24, a.dim = 16, a.n_layers = 2, a.n_dense_layers = 1, a.n_heads = 2, a.inter_dim = 24;
  a.q_lora_rank = 8, a.kv_lora_rank = 8, a.qk_nope_head_dim = 4, a.qk_rope_head_dim = 4, a.v_head_dim = 4;
  a.moe_inter_dim = 8, a.n_routed_experts = 4, a.n_shared_experts = 1, a.n_activated_experts = 2;
  a.n_expert_groups = 1, a.n_limited_groups = 1, a.max_seq_len = a.original_seq_len = 64;
  a.num_mtp_layers = mtp_layers;
  a.mtp_loss_weight = 0.3;
  return a;
}

// tokens [2, 7] and their targets [14] (one ignored), a batch where every MTP position differs.
struct Batch {
  Tensor tokens = Tensor::empty({2, 7}, DType::i32);
  Tensor targets = Tensor::empty({14}, DType::i32);
  Batch() {
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i <= 7; ++i) {
        const int32_t t = (r * 11 + i * 5 + i * i) % 24;
        if (i < 7) tokens.data<int32_t>()[r * 7 + i] = t;
        if (i > 0) targets.data<int32_t>()[r * 7 + i - 1] = t;
      }
    targets.data<int32_t>()[3] = -100;
  }
};

// The MTP loss written out from the model's pieces: h0 from the main blocks, then per module
// eh_proj([enorm(Emb(t_{i+k})); hnorm(h)]) -> block -> norm -> shared head, CE against t_{i+k+1}.
double composed_mtp_loss(Transformer& m, const Batch& b) {
  const int64_t rows = 2, s = 7, d = m.args().num_mtp_layers;
  Tensor pos = Tensor::empty({rows, s}, DType::i32);
  for (int64_t i = 0; i < rows * s; ++i) pos.data<int32_t>()[i] = int32_t(i % s);
  Variable h = m.tok_embeddings->forward(b.tokens, DType::f32);
  for (size_t l = 0; l < m.layers.size(); ++l) h = m.layers[l].forward(h, m.rope_tables(), pos);
  double total = 0;
  for (int64_t k = 1; k <= d; ++k) {
    Tensor ids = Tensor::zeros({rows, s}, DType::i32), labels = Tensor::full({rows * s}, -100, DType::i32);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i + k < s; ++i) {
        ids.data<int32_t>()[r * s + i] = b.tokens.data<int32_t>()[r * s + i + k];           // t_{i+k}
        labels.data<int32_t>()[r * s + i] = b.targets.data<int32_t>()[r * s + i + k];       // t_{i+k+1}
      }
    MtpModule& mod = (*m.mtp)[size_t(k - 1)];
    const Variable e = mod.enorm.forward(m.tok_embeddings->forward(ids, DType::f32));
    const Variable x = mod.eh_proj.forward(autograd::concat_last(e, mod.hnorm.forward(h)));
    h = mod.block.forward(x, m.rope_tables(), pos);
    const Variable logits = m.output->forward(autograd::view(mod.norm.forward(h), {rows * s, m.args().dim}));
    total += autograd::cross_entropy(logits, labels).value().item();
  }
  return m.args().mtp_loss_weight / double(d) * total;
}

// The weighted MTP loss of one training forward (its auxiliary losses are the modules' "mtp_loss"
// terms alone: no MoE balance loss is on) and each module's L_k.
struct MtpLoss {
  Variable weighted;
  std::vector<double> per_module;
};
MtpLoss mtp_loss(Transformer& m, const Batch& b) {
  models::AuxLosses aux;
  m.forward(b.tokens, b.targets, aux);
  MtpLoss out;
  for (const models::AuxLoss& a : aux) {
    EXPECT_EQ(a.name, "mtp_loss");
    out.weighted = out.weighted.defined() ? autograd::add(out.weighted, a.weighted) : a.weighted;
    out.per_module.push_back(a.value);
  }
  return out;
}

}  // namespace

TEST(DeepSeekV3Mtp, LossMatchesTheComposition) {
  for (int64_t d : {1, 2}) {
    Transformer m(tiny_args(d), moe_layer);
    m.init_parameters(7);
    const Batch b;
    const MtpLoss got = mtp_loss(m, b);
    autograd::NoGradGuard no_grad;
    EXPECT_NEAR(got.weighted.value().item(), composed_mtp_loss(m, b), 1e-5) << "D = " << d;
    EXPECT_EQ(got.per_module.size(), size_t(d));
    EXPECT_NEAR(got.per_module[0], std::log(24.0), 0.5);  // an untrained head: about chance
  }
}

// Activation recompute (full and selective) covers the MTP blocks too, with the same gradients.
TEST(DeepSeekV3Mtp, RecomputeGivesTheSameGradients) {
  const Batch b;
  std::vector<std::map<std::string, std::vector<double>>> grads;
  for (models::Recompute rc : {models::Recompute::none, models::Recompute::full, models::Recompute::selective}) {
    Transformer m(tiny_args(2), moe_layer);
    m.init_parameters(9);
    m.set_recompute(rc);
    Variable loss = mtp_loss(m, b).weighted;
    autograd::backward(loss);
    grads.emplace_back();
    for (auto& [name, p] : m.named_parameters())
      if (p->var.grad().defined()) grads.back()[name] = test::to_doubles(p->var.grad());
  }
  for (size_t r : {1, 2}) {
    ASSERT_EQ(grads[0].size(), grads[r].size());
    for (const auto& [name, g] : grads[0]) EXPECT_EQ(g, grads[r].at(name)) << name << ", recompute " << r;
  }
}

TEST(DeepSeekV3Mtp, OnlyATrainingForwardComputesIt) {
  Transformer m(tiny_args(1), moe_layer);
  m.init_parameters(3);
  const Batch b;
  const Tensor main_logits = m.forward(b.tokens).value().clone();  // no targets: no MTP at all
  // The main logits do not depend on the MTP modules.
  models::AuxLosses aux;
  EXPECT_EQ(test::to_doubles(m.forward(b.tokens, b.targets, aux).value()), test::to_doubles(main_logits));
  ASSERT_EQ(aux.size(), 1u);
  // A training step logs the unweighted loss and differentiates the weighted one.
  const models::TrainingLoss loss = m.training_loss(b.tokens, b.targets);
  const double l1 = aux[0].value;
  bool logged = false;
  for (const auto& [name, v] : loss.terms) {
    if (name != "mtp_loss") continue;
    logged = true;
    EXPECT_DOUBLE_EQ(v, l1);
  }
  EXPECT_TRUE(logged);
  EXPECT_NEAR(loss.total.value().item(), loss.cross_entropy + m.args().mtp_loss_weight * l1, 1e-5);
}

TEST(DeepSeekV3Mtp, ShiftsMaskTheLastKPositions) {
  const Batch b;
  const Tensor ids = models::mtp::shifted_tokens(b.tokens, 2);
  const Tensor lab = models::mtp::shifted_targets(b.targets, 2, 7, 2);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < 7; ++i) {
      EXPECT_EQ(ids.data<int32_t>()[r * 7 + i], i + 2 < 7 ? b.tokens.data<int32_t>()[r * 7 + i + 2] : 0);
      EXPECT_EQ(lab.data<int32_t>()[r * 7 + i], i + 2 < 7 ? b.targets.data<int32_t>()[r * 7 + i + 2] : -100);
    }
  EXPECT_EQ(lab.data<int32_t>()[1], -100);  // targets[3], ignored, stays ignored at i = 1
}

// d(MTP loss)/d(weight) against central differences, for weights of every part it reaches: the
// module's own (enorm, hnorm, eh_proj, block, norm), the shared embedding and head, and the main
// trunk (through h0). f32 throughout, so the step is large and the tolerance loose.
TEST(DeepSeekV3Mtp, GradientMatchesFiniteDifferences) {
  DeepSeekV3Args a = tiny_args(2);
  a.n_dense_layers = a.n_layers + a.num_mtp_layers;  // dense: routing would make the loss piecewise
  Transformer m(a);
  m.init_parameters(13);
  const Batch b;
  m.zero_grad();
  Variable loss = mtp_loss(m, b).weighted;
  autograd::backward(loss);
  const std::vector<std::string> names = {
      "mtp.0.enorm.weight",         "mtp.0.hnorm.weight",           "mtp.0.eh_proj.weight",
      "mtp.1.eh_proj.weight",       "mtp.0.block.attention.wkv_a.weight", "mtp.1.block.feed_forward.w2.weight",
      "mtp.1.norm.weight",          "tok_embeddings.weight",        "output.weight",
      "layers.1.attention.wq_b.weight", "layers.0.feed_forward.w1.weight", "norm.weight"};
  std::map<std::string, nn::Parameter*> params;
  for (auto& [n, p] : m.named_parameters()) params[n] = p;
  const double eps = 1e-2;
  for (const std::string& name : names) {
    ASSERT_TRUE(params.count(name)) << name;
    nn::Parameter& p = *params[name];
    const Tensor grad = p.var.grad();
    if (name == "norm.weight") {  // the main model's final norm is not on the MTP path
      if (grad.defined()) {
        for (double g : test::to_doubles(grad)) EXPECT_EQ(g, 0) << name;
      }
      continue;
    }
    ASSERT_TRUE(grad.defined()) << name;
    float* w = p.var.value().data<float>();
    for (int64_t j = 0; j < p.var.value().numel(); j += std::max<int64_t>(1, p.var.value().numel() / 5)) {
      const float keep = w[j];
      autograd::NoGradGuard no_grad;
      w[j] = keep + float(eps);
      m.refresh_compute_copies();
      const double up = mtp_loss(m, b).weighted.value().item();
      w[j] = keep - float(eps);
      m.refresh_compute_copies();
      const double down = mtp_loss(m, b).weighted.value().item();
      w[j] = keep;
      m.refresh_compute_copies();
      const double fd = (up - down) / (2 * eps), an = grad.data<float>()[j];
      EXPECT_NEAR(an, fd, 2e-4 + 3e-2 * std::abs(fd)) << name << "[" << j << "]";
    }
  }
}

TEST(DeepSeekV3Mtp, ArgsAndErrors) {
  const DeepSeekV3Args a = tiny_args(1);
  const DeepSeekV3Args::ParamCount c = a.parameters();
  Transformer m(a, moe_layer);
  int64_t mtp_params = 0;
  for (auto& [n, p] : m.named_parameters())
    if (n.rfind("mtp.", 0) == 0) mtp_params += p->var.value().numel();
  EXPECT_EQ(mtp_params, c.mtp);
  EXPECT_EQ(m.num_parameters(), c.total + c.mtp);
  EXPECT_EQ(c.total, tiny_args(0).parameters().total);
  EXPECT_GT(a.training_flops_per_token(8), tiny_args(0).training_flops_per_token(8));
  // DeepSeek-V3's published 685B = 671B + a 14B MTP module counted with its own copies of the
  // embedding and head, which ours shares.
  DeepSeekV3Args big = deepseek_v3_flavor("671B");
  big.num_mtp_layers = 1;
  const DeepSeekV3Args::ParamCount bc = big.parameters();
  EXPECT_NEAR(double(bc.mtp + 2 * bc.embedding) / 1e9, 14.0, 0.6);
  EXPECT_NEAR(double(bc.total + bc.mtp + 2 * bc.embedding) / 1e9, 685.0, 1.5);
  // Too short a sequence for the deepest module.
  Transformer deep(tiny_args(2), moe_layer);
  deep.init_parameters(1);
  Tensor tokens = Tensor::zeros({1, 2}, DType::i32), targets = Tensor::zeros({2}, DType::i32);
  try {
    models::AuxLosses deep_aux;
    deep.forward(tokens, targets, deep_aux);
    FAIL() << "a 2-token sequence with 2 MTP modules was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("seq_len"), std::string::npos) << e.what();
  }
  DeepSeekV3Args bad = tiny_args(1);
  bad.mtp_loss_weight = -1;
  EXPECT_THROW(bad.validate(), Error);
  models::ModelOptions with_mtp;
  with_mtp.mtp_layers = 1;
  EXPECT_THROW(models::build_model("llama3", "debugmodel", 64, 16, with_mtp), Error);
}

namespace {
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("titan_mtp_" + std::to_string(getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};
}  // namespace

// Ours "mtp.0.*" <-> HF "model.layers.2.*" both ways, DeepSeek's shared copies written and
// skipped, and the MTP layer ignored when config.json asks for none.
TEST(DeepSeekV3Mtp, HuggingFaceNamesRoundTrip) {
  const DeepSeekV3Args a = tiny_args(1);  // layer 1 and the MTP block (layer 2) are MoE
  Transformer m(a, moe_layer);
  m.init_parameters(21);
  const auto shapes = state_shapes(m.args());
  std::vector<std::pair<std::string, Tensor>> state;  // without the run-time token counts
  for (auto& [name, t] : m.state_dict())
    if (!name.ends_with("tokens_per_expert")) state.emplace_back(name, t);
  ASSERT_EQ(shapes.size(), state.size());
  std::map<std::string, Shape> want(shapes.begin(), shapes.end());  // buffers list after parameters
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_EQ(want.at(name), t.shape()) << name;
  }
  EXPECT_EQ(hf_names("mtp.0.enorm.weight", a), std::vector<std::string>{"model.layers.2.enorm.weight"});
  EXPECT_EQ(hf_names("mtp.0.eh_proj.weight", a), std::vector<std::string>{"model.layers.2.eh_proj.weight"});
  EXPECT_EQ(hf_names("mtp.0.norm.weight", a), std::vector<std::string>{"model.layers.2.shared_head.norm.weight"});
  EXPECT_EQ(hf_names("mtp.0.block.attention.wkv_b.weight", a),
            std::vector<std::string>{"model.layers.2.self_attn.kv_b_proj.weight"});
  EXPECT_EQ(hf_names("mtp.0.block.moe.experts.w2", a).back(), "model.layers.2.mlp.experts.3.down_proj.weight");
  EXPECT_THROW(hf_names("mtp.0.block.norm.weight", a), Error);
  EXPECT_THROW(hf_names("mtp.x.enorm.weight", a), Error);

  const TempDir dir("hf");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  save_hf(dir.path, m.args(), state, opt);
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir.path);
  EXPECT_EQ(folder.config().at("num_nextn_predict_layers").get<int64_t>(), 1);
  for (const char* n : {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight",
                        "model.layers.2.hnorm.weight", "model.layers.2.mlp.gate.e_score_correction_bias"})
    EXPECT_TRUE(folder.contains(n)) << n;
  std::unique_ptr<Transformer> back = load_hf_model(dir.path, moe_layer);
  ASSERT_NE(back->mtp, nullptr);
  std::map<std::string, Tensor> back_state;
  for (auto& [name, t] : back->state_dict()) back_state[name] = t;
  for (const auto& [name, t] : state) EXPECT_EQ(test::to_doubles(back_state.at(name)), test::to_doubles(t)) << name;

  // config.json without MTP: the same folder loads, the MTP layer skipped.
  nlohmann::json config = folder.config();
  config["num_nextn_predict_layers"] = 0;
  std::ofstream(dir.path / "config.json") << config.dump(2);
  std::unique_ptr<Transformer> plain = load_hf_model(dir.path, moe_layer);
  EXPECT_EQ(plain->mtp, nullptr);
  EXPECT_EQ(plain->num_parameters(), a.parameters().total);
}

// `titan train` with [model] mtp_layers = 1: a few steps of the debug flavor on a byte corpus, with
// the unweighted MTP loss logged per step and both losses falling.
TEST(DeepSeekV3Mtp, TrainsThroughTheTrainer) {
  const TempDir root("train");
  fs::create_directories(root.path / "data");
  {
    std::ofstream text(root.path / "data/corpus.txt");
    for (int d = 0; d < 60; ++d) text << "the cat sat on the mat. the dog lay on the rug.\n\n";
  }
  test::prepare_byte_dataset(root.path / "data/corpus.txt", root.path / "data", 0.05);
  const std::string toml = "[job]\ndump_folder = \"" + (root.path / "run").string() +
                           "\"\n[model]\nname = \"deepseek_v3\"\nflavor = \"debugmodel\"\nmtp_layers = 1\n"
                           "mtp_loss_weight = 0.3\n[training]\nlocal_batch_size = 2\nseq_len = 16\nsteps = 8\n"
                           "dataset_path = \"" + (root.path / "data/prepared").string() +
                           "\"\nmixed_precision_param = \"float32\"\n[optimizer]\nlr = 1e-3\n[lr_scheduler]\n"
                           "warmup_steps = 2\n[activation_checkpoint]\nmode = \"none\"\n[checkpoint]\nenable = false\n[metrics]\nlog_freq = 1\n"
                           "[validation]\nenable = false\n";
  train::Trainer trainer(train::parse_config(toml, "mtp.toml"), "mtp.toml");
  const train::TrainResult r = trainer.train();
  EXPECT_EQ(r.last_step, 8);
  std::vector<double> loss, mtp;
  std::ifstream f(root.path / "run/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    loss.push_back(j["loss"].get<double>());
    ASSERT_TRUE(j.contains("mtp_loss")) << line;
    mtp.push_back(j["mtp_loss"].get<double>());
  }
  ASSERT_EQ(mtp.size(), 8u);
  EXPECT_NEAR(mtp.front(), std::log(257.0), 1.0);
  EXPECT_LT(mtp.back(), mtp.front() - 0.5);
  EXPECT_LT(loss.back(), loss.front() - 0.5);
}
