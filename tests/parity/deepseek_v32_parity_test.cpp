// Golden parity of DeepSeek-V3.2 training (DeepSeek Sparse Attention) with the float64 reference
// reference/deepseek_v32.py: the tiny checkpoint in tests/fixtures/deepseek_v32_tiny/ (written by
// transformers' DeepseekV32ForCausalLM.save_pretrained; 1 dense + 1 MoE layer, sigmoid router
// with a correction bias) is loaded through the HF adapter and trained one step in each stage,
// with each DSA implementation (fused kernels and small ops). Logits, LM loss, each layer's
// indexer loss, the top-k selections and every gradient must match within f32 tolerances.
// Conventions of the golden file: the docstring of reference/deepseek_v32.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/hf.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/moe/moe.h"

using namespace titan;
using namespace titan::models::deepseek_v3;
using autograd::Variable;

namespace {

const std::string kDir = "tests/fixtures/deepseek_v32_tiny";

const checkpoint::SafetensorsFile& golden() {
  static const checkpoint::SafetensorsFile file = checkpoint::SafetensorsFile::open(kDir + "/golden.safetensors");
  return file;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : test::to_doubles(t)) m = std::max(m, std::fabs(v));
  return m;
}

// Tolerances scale with the tensor: the indexer's gradients carry the 0.01 coefficient and are
// orders of magnitude below the LM ones.
void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double atol = rtol * max_abs(want) + 1e-12;
  const auto e = test::compare(test::to_doubles(got), test::to_doubles(want), atol, rtol);
  EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1) << what << ": max_abs " << e.max_abs << " (x" << e.max_scaled
                                                     << " of tolerance; max |want| " << max_abs(want) << ") at " << e.worst;
}

Tensor positions_of(int64_t b, int64_t s) {
  Tensor p = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < b * s; ++i) p.data<int32_t>()[i] = int32_t(i % s);
  return p;
}

const char* impl_name(DsaImpl impl) { return impl == DsaImpl::fused ? "fused" : "small_ops"; }

// One training step's forward and backward (LM loss + the auxiliary losses) in `stage`, checked
// against the golden "<stage>." entries.
void check_stage(DsaStage stage, DsaImpl impl) {
  const std::string prefix = stage == DsaStage::dense_warmup ? "dense." : "sparse.";
  const std::string what = std::string(dsa_stage_name(stage)) + "/" + impl_name(impl);
  std::unique_ptr<Transformer> model = load_hf_model(kDir, moe_layer);
  ASSERT_TRUE(model->args().has_indexer());
  ASSERT_EQ(model->args().n_dense_layers, 1);
  const double coeff = golden().get("indexer_loss_coeff").item();
  model->set_dsa(stage, impl, coeff);
  const Tensor tokens = golden().get("tokens").clone(), targets = golden().get("targets").clone();

  autograd::TapeScope tape;
  models::AuxLosses aux;
  Variable logits = model->forward(tokens, targets, aux);
  expect_close(logits.value(), golden().get(prefix + "logits"), 1e-4, what + " logits");
  Variable loss = autograd::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.value().item(), golden().get(prefix + "loss").item(), 1e-5) << what;

  const Tensor want_kl = golden().get(prefix + "indexer_loss");  // [L], unweighted
  double mean_kl = 0;
  std::vector<double> kl;  // each layer's, in order
  for (const models::AuxLoss& a : aux)
    if (a.name == "indexer_loss") kl.push_back(a.value);
  ASSERT_EQ(kl.size(), model->layers.size()) << what;
  for (size_t l = 0; l < model->layers.size(); ++l) {
    const double want = want_kl.data<float>()[l];
    EXPECT_NEAR(kl[l], want, 1e-4 * want + 1e-7) << what << " indexer loss of layer " << l;
    mean_kl += want / double(model->layers.size());
  }

  // The warm-up freezes the LM path: only the indexer losses have a gradient to carry.
  Variable total = stage == DsaStage::sparse ? loss : Variable();
  for (const models::AuxLoss& a : aux) total = total.defined() ? autograd::add(total, a.weighted) : a.weighted;
  ASSERT_TRUE(total.defined()) << what;
  autograd::backward(total);

  int checked = 0;
  for (auto& [name, p] : model->named_parameters()) {
    const bool indexer = name.find(".attention.indexer.") != std::string::npos;
    const Tensor& grad = p->var.grad();
    if (stage == DsaStage::dense_warmup && !indexer) {
      EXPECT_FALSE(grad.defined()) << what << ": the warm-up trains only the indexer, but " << name << " has a gradient";
      continue;
    }
    ASSERT_TRUE(grad.defined()) << what << ": no gradient for " << name;
    const std::vector<std::string> hf = hf_names(name, model->args());
    const bool stacked = name.find("moe.experts.") != std::string::npos;  // [E, ...]: one HF tensor per expert
    for (size_t e = 0; e < hf.size(); ++e) {
      const Tensor g = stacked ? grad.select(0, int64_t(e)).contiguous() : grad;
      expect_close(g, golden().get(prefix + "grad." + hf[e]), 2e-4, what + " grad " + name + " (" + hf[e] + ")");
      ++checked;
    }
  }
  // Every gradient the golden file holds: dense 5 indexer tensors x 2 layers; sparse all 50 HF weights.
  EXPECT_EQ(checked, stage == DsaStage::dense_warmup ? 10 : 50) << what;

  // The trainer's entry point computes the same loss and logs the mean indexer loss.
  autograd::TapeScope again;
  const models::TrainingLoss tl = model->training_loss(tokens, targets);
  EXPECT_NEAR(tl.cross_entropy, golden().get(prefix + "loss").item(), 1e-5) << what;
  bool logged = false;
  for (const auto& [name, v] : tl.terms) {
    if (name != "indexer_loss") continue;
    EXPECT_NEAR(v, mean_kl, 1e-4 * mean_kl) << what;
    logged = true;
  }
  EXPECT_TRUE(logged) << what << ": training_loss() logs no indexer_loss";
}

}  // namespace

TEST(DeepSeekV32Parity, DenseWarmupFusedMatchesReference) { check_stage(DsaStage::dense_warmup, DsaImpl::fused); }
TEST(DeepSeekV32Parity, DenseWarmupSmallOpsMatchesReference) { check_stage(DsaStage::dense_warmup, DsaImpl::small_ops); }
TEST(DeepSeekV32Parity, SparseFusedMatchesReference) { check_stage(DsaStage::sparse, DsaImpl::fused); }
TEST(DeepSeekV32Parity, SparseSmallOpsMatchesReference) { check_stage(DsaStage::sparse, DsaImpl::small_ops); }

// Each layer's indexer (both implementations of its Hadamard rotation), run on the model's own
// activations, selects the reference's top-k sets: kernels::indexer_topk lists each row ascending
// with -1 padding, as the golden file does. The selection margins of the fixture are >= 1e-3 of
// the row's score scale, so f32 cannot flip a boundary.
TEST(DeepSeekV32Parity, IndexerSelectsTheReferenceTopK) {
  const Tensor want = golden().get("sparse.topk_indices");  // [L, B, S, K] i32
  const Tensor tokens = golden().get("tokens").clone();
  const int64_t b = tokens.size(0), s = tokens.size(1);
  for (DsaImpl impl : {DsaImpl::fused, DsaImpl::small_ops}) {
    std::unique_ptr<Transformer> model = load_hf_model(kDir, moe_layer);
    model->set_dsa(DsaStage::sparse, impl, golden().get("indexer_loss_coeff").item());
    ASSERT_EQ(want.size(3), model->args().index_topk);
    autograd::NoGradGuard no_grad;
    const Tensor positions = positions_of(b, s);
    Variable h = model->tok_embeddings->forward(tokens, DType::f32);  // [B, S, D]
    for (size_t l = 0; l < model->layers.size(); ++l) {
      TransformerBlock& block = model->layers[l];
      const Variable x = block.attention_norm.forward(h);
      const Variable qr = block.attention.q_norm->forward(block.attention.wq_a->forward(x));
      const Indexer::Outputs io = block.attention.indexer->forward(x, qr, model->rope_tables(), positions, impl);
      Tensor idx = Tensor::empty({b, s, model->args().index_topk}, DType::i32);
      kernels::indexer_topk(idx, io.q.value().contiguous(), io.k.value().contiguous(), io.w.value().contiguous());
      const Tensor ref = want.select(0, int64_t(l)).contiguous();
      EXPECT_EQ(test::to_doubles(idx), test::to_doubles(ref)) << impl_name(impl) << " layer " << l;
      h = block.forward(h, model->rope_tables(), positions);
    }
  }
}

// The warm-up's forward is DeepSeek-V3's: the same checkpoint without its indexer tensors, in the
// V3 model (no indexer), gives the dense stage's logits and loss.
TEST(DeepSeekV32Parity, DenseWarmupForwardIsDeepSeekV3) {
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(kDir);
  DeepSeekV3Args a = args_from_hf_config(folder.config(), kDir);
  a.index_n_heads = 0;
  Transformer model(a, moe_layer);
  std::vector<std::pair<std::string, Shape>> wanted;
  for (const auto& [name, p] : model.named_parameters()) wanted.emplace_back(name, p->var.shape());
  for (const auto& [name, t] : model.named_buffers())
    if (name.ends_with("moe.expert_bias")) wanted.emplace_back(name, t.shape());
  model.load_state_dict(load_hf_state(folder, a, wanted, /*strict=*/false), /*strict=*/false, kDir);
  autograd::NoGradGuard no_grad;
  const Variable logits = model.forward(golden().get("tokens").clone());
  expect_close(logits.value(), golden().get("dense.logits"), 1e-4, "V3 logits");
  EXPECT_NEAR(autograd::cross_entropy(logits, golden().get("targets").clone()).value().item(),
              golden().get("dense.loss").item(), 1e-5);
}
