// DeepSeek-V3.2 (DeepSeek-V3 + DeepSeek Sparse Attention): flavors and parameter counts, the fused
// DSA path against the small-op path (both stages: loss, indexer loss, every gradient), the
// consistency checks of docs/dsa.md section 7.8 (top-k >= S: sparse equals dense MLA, and the sparse
// target equals the dense one), the warm-up freeze, the detachment of the indexer, and bad configs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "titan/autograd/ops.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/deepseek_v3/mtp.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"

using namespace titan;
using namespace titan::models::deepseek_v3;
using autograd::Variable;

namespace {

// Small enough for a quick test, with a query latent, YaRN (max_seq_len > original_seq_len), an
// indexer with 2 heads and the Hadamard rotation, and top-5 of up to 12 keys (a real selection).
DeepSeekV3Args tiny() {
  DeepSeekV3Args a = deepseek_v32_flavor("debugmodel", 61);
  a.dim = 32, a.n_layers = 2, a.n_heads = 3, a.inter_dim = 40;
  a.q_lora_rank = 24, a.kv_lora_rank = 16, a.qk_nope_head_dim = 8, a.qk_rope_head_dim = 8, a.v_head_dim = 12;
  a.max_seq_len = 64, a.original_seq_len = 32;
  a.index_n_heads = 2, a.index_head_dim = 16, a.index_topk = 5;
  return a;
}

constexpr int64_t kB = 2, kS = 12;

Tensor tokens(int64_t b = kB, int64_t s = kS) {
  Tensor t = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = int32_t((i * 37 + 11) % 61);
  return t;
}

Tensor targets(int64_t n = kB * kS) {
  Tensor t = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = int32_t((i * 13 + 5) % 61);
  return t;
}

struct StepResult {
  double lm_loss = 0, indexer_loss = 0;
  size_t aux_count = 0;                 // the auxiliary losses the forward returned
  std::map<std::string, Tensor> grads;  // undefined entries: no gradient
  Tensor logits;
};

// One forward + backward of LM loss + the auxiliary (indexer) losses.
StepResult run(Transformer& m, bool with_lm = true, bool with_aux = true) {
  autograd::TapeScope tape;
  for (auto& [name, p] : m.named_parameters()) p->var.clear_grad();  // "no gradient" stays observable
  StepResult r;
  models::AuxLosses aux;
  Variable logits = m.forward(tokens(), targets(), aux);
  r.logits = logits.value().clone();
  Variable loss = autograd::cross_entropy(logits, targets());
  r.lm_loss = loss.value().item();
  Variable total;
  if (with_lm && loss.requires_grad()) total = loss;
  for (const models::AuxLoss& a : aux)
    if (with_aux) total = total.defined() ? autograd::add(total, a.weighted) : a.weighted;
  // The logged indexer loss: the unweighted mean over the layers' (the MTP blocks' included).
  int indexers = 0;
  for (const models::AuxLoss& a : aux)
    if (a.name == "indexer_loss") r.indexer_loss += a.value, ++indexers;
  r.indexer_loss /= std::max(indexers, 1);
  r.aux_count = aux.size();
  if (total.defined()) autograd::backward(total);
  for (auto& [name, p] : m.named_parameters()) r.grads[name] = p->var.grad().defined() ? p->var.grad().clone() : Tensor();
  return r;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(double(t.data<float>()[i])));
  return m;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

// cos(a, b) of two gradients as vectors (0 when either is all zero).
double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    ab += x * y, aa += x * x, bb += y * y;
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0;
}

void expect_same_grads(const StepResult& a, const StepResult& b, const std::string& what, double rtol = 2e-4) {
  for (const auto& [name, ga] : a.grads) {
    const Tensor& gb = b.grads.at(name);
    ASSERT_EQ(ga.defined(), gb.defined()) << what << ": " << name;
    if (!ga.defined()) continue;
    EXPECT_LE(max_diff(ga, gb), rtol * (max_abs(ga) + 1e-6)) << what << ": " << name << " (max " << max_abs(ga) << ")";
  }
}

std::unique_ptr<Transformer> model(const DeepSeekV3Args& a, uint64_t seed = 7) {
  auto m = std::make_unique<Transformer>(a);
  m->init_parameters(seed);
  return m;
}

}  // namespace

TEST(DeepSeekV32Args, FlavorsAndParameterCounts) {
  for (const std::string& f : deepseek_v32_flavor_names()) EXPECT_NO_THROW(deepseek_v32_flavor(f, 1000)) << f;
  const DeepSeekV3Args d = deepseek_v32_flavor("debugmodel");
  EXPECT_TRUE(d.has_indexer());
  EXPECT_GT(d.q_lora_rank, 0);
  EXPECT_EQ(d.index_n_heads, 4);
  EXPECT_EQ(d.index_head_dim, 64);
  EXPECT_EQ(d.index_topk, 256);
  // 671B: DeepSeek-V3's 671B plus 61 indexers of 64 x 128 (wq_b 8192 x 1536, wk, k_norm, weights_proj).
  const DeepSeekV3Args b = deepseek_v32_flavor("671B");
  const int64_t indexer = 64 * 128 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168;
  EXPECT_EQ(b.parameters().total, deepseek_v3_flavor("671B").parameters().total + 61 * indexer);
  EXPECT_EQ(b.index_topk, 2048);
  // The built model's parameters are what the analytic count says, indexer included.
  const DeepSeekV3Args a = tiny();
  Transformer m(a);
  EXPECT_EQ(m.num_parameters(), m.args().parameters().total);
  EXPECT_NE(m.child("layers")->child("0")->child("attention")->child("indexer"), nullptr);
  const auto names = m.named_parameters();
  bool found = false;
  for (auto& [n, p] : names) found = found || n == "layers.1.attention.indexer.k_norm.bias";
  EXPECT_TRUE(found);
  // FLOPs count the indexer's projections (parameters) and its scores.
  DeepSeekV3Args plain = a;
  plain.index_n_heads = 0;
  Transformer p(plain);
  EXPECT_DOUBLE_EQ(a.training_flops_per_token(64) - plain.training_flops_per_token(64),
                   6.0 * double(m.num_parameters() - p.num_parameters()) + 6.0 * 2 * 2 * 16 * 64);
  // The built model counts the stage in force: the sparse stage attends to the top-k (5 here), the
  // dense warm-up attends to every key but trains only the indexers (the rest runs forward: 1/3).
  const double attention_per_key = 6.0 * 2 * 3 * (8 + 8 + 12), scores = 6.0 * 2 * 2 * 16 * 64;
  const double indexers = 2.0 * double(m.num_parameters() - p.num_parameters());
  const DeepSeekV3Args& built = m.args();  // all layers dense: no MoE factory was given
  const double main = built.training_flops_per_token(64) - 64 * attention_per_key - scores - 3 * indexers;
  EXPECT_DOUBLE_EQ(m.training_flops_per_token(64), main + 5 * attention_per_key + scores + 3 * indexers);
  m.set_dsa(DsaStage::dense_warmup, DsaImpl::fused, 0.01);
  EXPECT_DOUBLE_EQ(m.training_flops_per_token(64), main / 3 + 64 * attention_per_key / 3 + scores + 3 * indexers);
  m.set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01, 100);  // a top-k beyond the sequence: every key
  EXPECT_DOUBLE_EQ(m.training_flops_per_token(64), built.training_flops_per_token(64));
}

TEST(DeepSeekV32Args, BadConfigsFail) {
  DeepSeekV3Args a = tiny();
  a.q_lora_rank = 0;
  try {
    a.validate();
    FAIL() << "an indexer without a query latent was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_lora_rank"), std::string::npos) << e.what();
  }
  models::ModelOptions npu;
  npu.converters = {"npu_dsa"};
  try {
    models::build_model("deepseek_v32", "debugmodel", 100, 64, npu);
    FAIL() << "an unknown converter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("npu_dsa"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("dsa_fused"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(models::build_model("deepseek_v32", "16B", 100, 64), Error);
  EXPECT_NO_THROW(models::build_model("deepseek_v32", "debugmodel", 100, 64));
}

TEST(DeepSeekV32Model, FusedMatchesSmallOpsInBothStages) {
  for (DsaStage stage : {DsaStage::dense_warmup, DsaStage::sparse}) {
    const std::string what = dsa_stage_name(stage);
    auto fused = model(tiny()), small = model(tiny());
    fused->set_dsa(stage, DsaImpl::fused, 0.5);
    small->set_dsa(stage, DsaImpl::small_ops, 0.5);
    const StepResult f = run(*fused), s = run(*small);
    EXPECT_NEAR(f.lm_loss, s.lm_loss, 1e-5) << what;
    EXPECT_GT(s.indexer_loss, 0) << what;
    EXPECT_NEAR(f.indexer_loss, s.indexer_loss, 1e-5 * (1 + s.indexer_loss)) << what;
    EXPECT_LE(max_diff(f.logits, s.logits), 1e-4) << what;
    expect_same_grads(f, s, what);
  }
}

TEST(DeepSeekV32Model, FullSelectionEqualsDenseMlaAndTheDenseTarget) {
  // top-k >= S: every causal key is selected, so the sparse model is DeepSeek-V3 (same weights)
  // and the sparse stage's KL target is the dense warm-up's.
  DeepSeekV3Args a = tiny();
  a.index_topk = kS;
  DeepSeekV3Args v3 = a;
  v3.index_n_heads = 0;
  auto dense = model(v3);
  const StepResult ref = run(*dense, true, false);
  for (DsaImpl impl : {DsaImpl::small_ops, DsaImpl::fused}) {
    auto m = model(a);  // same seed: the shared parameters get the same values (keyed by name)
    m->set_dsa(DsaStage::sparse, impl, 0.01);
    const StepResult sparse = run(*m);
    EXPECT_LE(max_diff(sparse.logits, ref.logits), 2e-5);
    for (const auto& [name, g] : ref.grads) {
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_LE(max_diff(sparse.grads.at(name), g), 2e-4 * (max_abs(g) + 1e-6)) << name;
    }
    m->set_dsa(DsaStage::dense_warmup, impl, 0.01);
    const StepResult warm = run(*m);
    EXPECT_NEAR(warm.indexer_loss, sparse.indexer_loss, 1e-5 * (1 + warm.indexer_loss));
    expect_same_grads(warm, StepResult{0, 0, 0, [&] {
                                         std::map<std::string, Tensor> only;  // the indexer part of sparse's
                                         for (auto& [n, g] : sparse.grads)
                                           only[n] = n.find(".indexer.") != std::string::npos ? g : Tensor();
                                         return only;
                                       }(), {}},
                      "indexer gradients, warm-up vs full selection");
  }
}

TEST(DeepSeekV32Model, MixedPrecisionFusedFollowsTheF32Reference) {
  // bf16 compute: the fused kernels run in bf16, the small ops in f32 on the same bf16 model
  // around them. With top-k >= S the selection cannot differ, so the two agree to bf16 accuracy.
  DeepSeekV3Args a = tiny();
  a.index_topk = kS;
  for (DsaStage stage : {DsaStage::dense_warmup, DsaStage::sparse}) {
    const std::string what = dsa_stage_name(stage);
    auto fused = model(a), small = model(a);
    fused->set_compute_dtype(DType::bf16);
    small->set_compute_dtype(DType::bf16);
    fused->set_dsa(stage, DsaImpl::fused, 0.5);
    small->set_dsa(stage, DsaImpl::small_ops, 0.5);
    const StepResult f = run(*fused), s = run(*small);
    EXPECT_NEAR(f.lm_loss, s.lm_loss, 2e-2) << what;
    EXPECT_NEAR(f.indexer_loss, s.indexer_loss, 0.05 * s.indexer_loss + 1e-4) << what;
    for (const auto& [name, g] : s.grads) {
      ASSERT_EQ(g.defined(), f.grads.at(name).defined()) << what << ": " << name;
      if (g.defined()) {
        EXPECT_LE(max_diff(f.grads.at(name), g), 0.03 * max_abs(g) + 1e-6) << what << ": " << name;
      }
    }
  }
  // A real selection (top-5 of 12) in bf16 trains: its step follows the f32 fused step on the
  // same weights (both losses; every gradient points the same way, though a near-tie may select
  // a different key in bf16), and AdamW steps on it fit the batch. (The indexer loss is no
  // measure of that: it starts near 0 and grows as the attention it imitates sharpens.)
  auto m = model(tiny()), m32 = model(tiny());
  m->set_compute_dtype(DType::bf16);
  m->set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01);
  m32->set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01);
  const StepResult r = run(*m), r32 = run(*m32);
  EXPECT_NEAR(r.lm_loss, r32.lm_loss, 2e-2);
  EXPECT_NEAR(r.indexer_loss, r32.indexer_loss, 0.1 * r32.indexer_loss + 1e-4);
  for (const auto& [name, g] : r32.grads) {
    ASSERT_TRUE(g.defined() && r.grads.at(name).defined()) << name;
    EXPECT_GT(cosine(r.grads.at(name), g), 0.9) << name;
  }
  auto params = m->named_parameters();
  optim::AdamW opt(params, kernels::AdamWParams{});
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    (step == 0 ? first : last) = run(*m).lm_loss;
    opt.step(1e-2f, optim::clip_grad_norm(params, 1.0).scale);
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(DeepSeekV32Model, WarmupFreezesEverythingButTheIndexers) {
  for (DsaImpl impl : {DsaImpl::small_ops, DsaImpl::fused}) {
    auto m = model(tiny());
    m->set_dsa(DsaStage::dense_warmup, impl, 0.01);
    std::map<std::string, Tensor> before;
    for (auto& [n, p] : m->named_parameters()) before[n] = p->var.value().clone();
    auto params = m->named_parameters();
    optim::AdamW opt(params, kernels::AdamWParams{});
    const StepResult r = run(*m);
    EXPECT_TRUE(std::isfinite(r.lm_loss));
    const auto norm = optim::clip_grad_norm(params, 1.0);
    opt.step(1e-2f, norm.scale);
    for (auto& [n, p] : params) {
      const bool indexer = n.find(".attention.indexer.") != std::string::npos;
      EXPECT_EQ(p->var.requires_grad(), indexer) << n;
      EXPECT_EQ(p->var.grad().defined(), indexer) << n;
      if (indexer) {
        EXPECT_GT(max_diff(p->var.value(), before[n]), 0) << n << " did not train";
      } else {
        EXPECT_EQ(max_diff(p->var.value(), before[n]), 0) << n << " changed while frozen";
      }
    }
    m->set_dsa(DsaStage::sparse, impl, 0.01);
    for (auto& [n, p] : params) EXPECT_TRUE(p->var.requires_grad()) << n;
  }
}

TEST(DeepSeekV32Model, IndexerAndMainModelLearnFromTheirOwnLossOnly) {
  for (DsaImpl impl : {DsaImpl::small_ops, DsaImpl::fused}) {
    auto m = model(tiny());
    m->set_dsa(DsaStage::sparse, impl, 0.01);
    const StepResult lm = run(*m, true, false);
    const StepResult aux = run(*m, false, true);
    for (auto& [n, g] : lm.grads) {
      const bool indexer = n.find(".indexer.") != std::string::npos;
      EXPECT_EQ(g.defined(), !indexer) << n << ": the LM loss " << (indexer ? "reached" : "missed") << " it";
      EXPECT_EQ(aux.grads.at(n).defined(), indexer) << n << ": the indexer loss " << (indexer ? "missed" : "reached")
                                                    << " it";
    }
  }
}

TEST(DeepSeekV32Model, SparseDecodeMatchesTheSparseForward) {
  // Generation attends to the top-k cached rows once the context exceeds k: a prompt decoded at
  // once and then token by token gives the sparse forward's logits at every position.
  auto m = model(tiny());
  m->set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01);
  const Tensor tok = tokens();
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = m->forward(tok).value().clone();  // [B * S, V]
    m->set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01, kS);
    const Tensor dense = m->forward(tok).value();
    EXPECT_GT(max_diff(full, dense), 1e-3) << "top-5 of 12 should change the logits";
    m->set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01);
  }
  const int64_t vocab = full.size(1), prompt = 3;
  m->start_generation(kB, kS);
  auto expect_row = [&](const Tensor& got, int64_t pos) {
    for (int64_t bi = 0; bi < kB; ++bi)
      for (int64_t v = 0; v < vocab; ++v)
        ASSERT_NEAR(got.data<float>()[bi * vocab + v], full.data<float>()[(bi * kS + pos) * vocab + v], 2e-4)
            << "position " << pos;
  };
  expect_row(m->decode(tok.slice(1, 0, prompt).contiguous()), prompt - 1);
  for (int64_t pos = prompt; pos < kS; ++pos) expect_row(m->decode(tok.slice(1, pos, pos + 1).contiguous()), pos);
}

TEST(DeepSeekV32Model, MtpBlocksFollowTheDsaStageAndTrainTheirIndexer) {
  DeepSeekV3Args a = tiny();
  a.num_mtp_layers = 1;
  auto m = model(a);
  m->set_dsa(DsaStage::dense_warmup, DsaImpl::fused, 0.01);
  const StepResult r = run(*m, false, true);
  EXPECT_TRUE(r.grads.at("mtp.0.block.attention.indexer.wq_b.weight").defined());
  EXPECT_FALSE(r.grads.at("mtp.0.block.attention.wkv_b.weight").defined());  // frozen in the warm-up
  EXPECT_TRUE(r.grads.at("layers.0.attention.indexer.wk.weight").defined());
  EXPECT_EQ(r.aux_count, 4u);  // 2 layers' + the MTP block's indexer losses, the MTP loss
}

TEST(DeepSeekV32Model, NoGradForwardSkipsTheIndexerLoss) {
  auto m = model(tiny());
  models::AuxLosses aux;
  {
    autograd::NoGradGuard no_grad;
    m->forward(tokens(), targets(), aux);
  }
  EXPECT_TRUE(aux.empty());
  DeepSeekV3Args v3 = tiny();
  v3.index_n_heads = 0;
  Transformer plain(v3);
  EXPECT_THROW(plain.set_dsa(DsaStage::sparse, DsaImpl::fused, 0.01), Error);
}

// Full activation checkpointing changes memory, not results: in both stages and with both
// implementations the losses and every gradient (the indexers' from their KL loss, which the
// checkpointed blocks return as extra outputs) match the run without it. With MoE layers and the
// sequence-wise balance loss on, that loss keeps its gradient through the recompute too.
TEST(DeepSeekV32Model, ActivationCheckpointingKeepsLossesAndGradients) {
  DeepSeekV3Args moe_args = tiny();
  moe_args.moe_inter_dim = 16, moe_args.aux_loss_alpha = 0.1;
  for (models::Recompute rc : {models::Recompute::full, models::Recompute::selective})
    for (bool moe : {false, true})
      for (DsaImpl impl : {DsaImpl::small_ops, DsaImpl::fused})
        for (DsaStage stage : {DsaStage::dense_warmup, DsaStage::sparse}) {
          const std::string what = std::string(dsa_stage_name(stage)) + (impl == DsaImpl::fused ? ", fused" : ", small ops") +
                                   (moe ? ", MoE" : ", dense") + (rc == models::Recompute::full ? ", full" : ", selective");
          auto make = [&] {
            auto m = moe ? std::make_unique<Transformer>(moe_args, moe_layer) : std::make_unique<Transformer>(tiny());
            m->init_parameters(7);
            m->set_dsa(stage, impl, 0.5);
            return m;
          };
          auto plain = make(), ac = make();
          ac->set_recompute(rc);
          const StepResult p = run(*plain), r = run(*ac);
          EXPECT_EQ(r.aux_count, p.aux_count) << what;
          EXPECT_NEAR(r.lm_loss, p.lm_loss, 1e-6) << what;
          EXPECT_GT(p.indexer_loss, 0) << what;
          EXPECT_NEAR(r.indexer_loss, p.indexer_loss, 1e-6 * (1 + p.indexer_loss)) << what;
          expect_same_grads(p, r, what, 1e-5);
        }
}
