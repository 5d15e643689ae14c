// Golden parity with Hugging Face transformers' DeepseekV3ForCausalLM (reference/deepseek_v3.py):
// tiny checkpoints in tests/fixtures/deepseek_v3_tiny*/ are loaded through the HF adapter, and
// logits, loss and every gradient must match the float64 reference within f32 tolerances. This
// pins MLA (q latent or plain q path, YaRN softmax scale or none, interleaved RoPE on the
// decoupled dims), the block layout and the HF name mapping at once; the MoE fixture adds
// DeepSeek-V3's routing (sigmoid scores, the correction bias steering the choice, group-limited
// top-k, norm_topk_prob, routed_scaling_factor), the shared expert and the stacked expert layout.
// The _saved fixtures (reference/deepseek_v3_saved.py) are folders transformers' save_pretrained
// wrote, one as is (num_nextn_predict_layers 1, no MTP weights) and one with DeepSeek's MTP layer
// added; the latter's golden MTP loss pins the imported MTP module (mtp.h) against DeepSeek's.
#include <gtest/gtest.h>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/models/deepseek_v3/mtp.h"

using namespace titan;
using namespace titan::models::deepseek_v3;

namespace {

const char* kFixtureDir = "tests/fixtures/deepseek_v3_tiny";  // q_lora_rank > 0, YaRN
const char* kPlainQDir = "tests/fixtures/deepseek_v3_tiny_plain_q";  // plain q_proj, no rope scaling
const char* kMoeDir = "tests/fixtures/deepseek_v3_tiny_moe";  // a dense then a MoE layer, sigmoid group routing
const char* kSavedDir = "tests/fixtures/deepseek_v3_tiny_saved";  // as save_pretrained writes it: no MTP weights
const char* kSavedMtpDir = "tests/fixtures/deepseek_v3_tiny_saved_mtp";  // plus the hub's MTP layer (MoE block)

void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto e = test::compare(test::to_doubles(got), test::to_doubles(want), atol, rtol);
  EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1) << what << ": max_abs " << e.max_abs << " (x" << e.max_scaled
                                                     << " of tolerance) at " << e.worst;
}

void check_against_golden(const std::string& dir, Transformer& model) {
  const auto golden = checkpoint::SafetensorsFile::open(dir + "/golden.safetensors");
  const Tensor tokens = golden.get("tokens").clone(), targets = golden.get("targets").clone();
  autograd::Variable logits = model.forward(tokens);
  expect_close(logits.value(), golden.get("logits"), 2e-5, 1e-4, "logits");
  autograd::Variable loss = autograd::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.value().item(), golden.get("loss").item(), 1e-5);
  autograd::backward(loss);
  for (auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p->var.grad().defined()) << name;
    // Stacked experts [E, ...] compare slice by slice with HF's per-expert gradients.
    const std::vector<std::string> hf = hf_names(name, model.args());
    const bool stacked = name.find("moe.experts.") != std::string::npos;
    ASSERT_TRUE(stacked || hf.size() == 1u) << name;
    for (size_t e = 0; e < hf.size(); ++e)
      expect_close(stacked ? p->var.grad().select(0, int64_t(e)).contiguous() : p->var.grad(),
                   golden.get("grad." + hf[e]), 1e-6, 2e-4, "grad " + name + " (" + hf[e] + ")");
  }
}

}  // namespace

TEST(DeepSeekV3Parity, QueryLatentWithYarnMatchesHuggingFace) {
  std::unique_ptr<Transformer> model = load_hf_model(kFixtureDir);
  ASSERT_GT(model->args().q_lora_rank, 0);
  ASSERT_TRUE(model->args().yarn());
  ASSERT_NE(model->args().mscale, 1.0);
  check_against_golden(kFixtureDir, *model);
}

TEST(DeepSeekV3Parity, PlainQueryWithoutRopeScalingMatchesHuggingFace) {
  std::unique_ptr<Transformer> model = load_hf_model(kPlainQDir);
  ASSERT_EQ(model->args().q_lora_rank, 0);
  ASSERT_FALSE(model->args().yarn());
  check_against_golden(kPlainQDir, *model);
}

// The router gate's gradient flows, as in HF, only through the gate values of the chosen experts
// (the choice itself, and the bias, get none), so it matches like every other weight.
TEST(DeepSeekV3Parity, MoeLayerMatchesHuggingFace) {
  std::unique_ptr<Transformer> model = load_hf_model(kMoeDir, moe_layer);
  const DeepSeekV3Args& a = model->args();
  ASSERT_EQ(a.n_dense_layers, 1);
  ASSERT_EQ(a.n_layers, 2);
  ASSERT_EQ(a.score_func, ScoreFunc::sigmoid);
  ASSERT_TRUE(a.route_norm);
  ASSERT_EQ(a.n_expert_groups, 4);
  ASSERT_EQ(a.n_limited_groups, 2);
  ASSERT_DOUBLE_EQ(a.route_scale, 2.5);
  // The correction bias came from the checkpoint (nonzero: the fixture checks it changes choices).
  double bias_abs = 0;
  for (const auto& [name, t] : model->named_buffers())
    if (name.ends_with("moe.expert_bias"))
      for (int64_t e = 0; e < t.numel(); ++e) bias_abs += std::abs(t.data<float>()[e]);
  EXPECT_GT(bias_abs, 0.1);
  check_against_golden(kMoeDir, *model);
}

TEST(DeepSeekV3Parity, Bf16MixedPrecisionStaysClose) {
  const auto golden = checkpoint::SafetensorsFile::open(std::string(kFixtureDir) + "/golden.safetensors");
  std::unique_ptr<Transformer> model = load_hf_model(kFixtureDir);
  model->set_compute_dtype(DType::bf16);
  const Tensor tokens = golden.get("tokens").clone(), targets = golden.get("targets").clone();
  autograd::Variable logits = model->forward(tokens);
  EXPECT_EQ(logits.dtype(), DType::bf16);
  autograd::Variable loss = autograd::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.value().item(), golden.get("loss").item(), 3e-2);
  autograd::backward(loss);
  for (auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p->var.grad().dtype(), DType::f32) << name;
    expect_close(p->var.grad(), golden.get("grad." + hf_names(name, model->args())[0]), 3e-3, 0.15, "bf16 grad " + name);
  }
}

// Decoding through MLA's absorbed form and latent cache (prompt, then one token at a time) gives
// the logits of the standard form's full forward.
TEST(DeepSeekV3Parity, LatentCachedDecodeMatchesFullForward) {
  for (const std::string dir : {kFixtureDir, kPlainQDir}) {
  const auto golden = checkpoint::SafetensorsFile::open(dir + "/golden.safetensors");
  std::unique_ptr<Transformer> model = load_hf_model(dir);
  const Tensor tokens = golden.get("tokens").clone();  // [B, S]
  const int64_t b = tokens.size(0), s = tokens.size(1), v = model->vocab_size();
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = model->forward(tokens).value();  // [B*S, V]
  }
  const int64_t prompt = 5;
  model->start_generation(b, s);
  Tensor logits = model->decode(tokens.slice(1, 0, prompt).contiguous());
  for (int64_t pos = prompt - 1; pos < s; ++pos) {
    if (pos >= prompt) logits = model->decode(tokens.slice(1, pos, pos + 1).contiguous());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < v; j += 5) ASSERT_NEAR(logits.at({bi, j}), full.at({bi * s + pos, j}), 1e-4) << dir << " " << pos;
  }
  }
}

// A folder transformers saved (config.json: num_nextn_predict_layers 1, no MTP weights) loads
// without MTP and gives HF's logits; the same folder with DeepSeek's MTP layer loads it as mtp.0,
// the main logits unchanged and the MTP loss DeepSeek's (as vLLM and SGLang run the hub weights).
TEST(DeepSeekV3Parity, SavedFoldersWithAndWithoutMtpMatchHuggingFace) {
  for (const char* dir : {kSavedDir, kSavedMtpDir}) {
    const bool with_mtp = dir == kSavedMtpDir;
    const auto golden = checkpoint::SafetensorsFile::open(std::string(dir) + "/golden.safetensors");
    std::unique_ptr<Transformer> model = load_hf_model(dir, moe_layer);
    ASSERT_EQ(model->args().num_mtp_layers, with_mtp ? 1 : 0) << dir;
    ASSERT_EQ(model->mtp != nullptr, with_mtp) << dir;
    ASSERT_EQ(model->args().n_dense_layers, 1) << dir;  // the MTP block (layer 2) is MoE, as DeepSeek-V3's
    autograd::NoGradGuard no_grad;
    const Tensor tokens = golden.get("tokens").clone(), targets = golden.get("targets").clone();
    models::AuxLosses aux;
    expect_close(model->forward(tokens, targets, aux).value(), golden.get("logits"), 2e-5, 1e-4,
                 std::string(dir) + " logits");
    if (!with_mtp) continue;
    ASSERT_EQ(aux.size(), 1u);  // the MTP loss (no balance loss is on)
    EXPECT_EQ(aux[0].name, "mtp_loss");
    EXPECT_NEAR(aux[0].value, golden.get("mtp_loss").item(), 2e-5);
  }
}
