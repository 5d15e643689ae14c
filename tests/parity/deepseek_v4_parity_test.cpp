// DeepSeek-V4 (models/deepseek_v4/model.h) against transformers' DeepseekV4ForCausalLM on the
// tiny model of tests/fixtures/deepseek_v4_tiny (reference/deepseek_v4_fixture.py: every layer
// kind, both routings, YaRN on the compressed layers, randomised zero / one inits), f32: the
// weights loaded through the Hugging Face adapter, then the logits, the loss and every
// parameter's gradient, each to 1e-5 relative (Frobenius; a gradient whose transformers' norm is
// 0, the indexers' there, must be 0 here too). The adapter's way back gives the same names.
// Except the hyper-connections' own parameters (fn, base, scale, the head's too): 3e-4. Their
// gradients are small sums over every token of terms of both signs, and f32 cannot pin them to
// 1e-5: transformers' own f32 gradients of hc_head differ from its float64 ones by up to 1.6e-4
// (hc_scale; 4.7e-5 hc_base, 2.0e-5 hc_fn), measured on this fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v4/hf_adapter.h"
#include "titan/models/deepseek_v4/model.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr const char* kFolder = "tests/fixtures/deepseek_v4_tiny";

std::map<std::string, Tensor> read_all(const std::string& path) {
  const auto file = checkpoint::SafetensorsFile::open(path);
  std::map<std::string, Tensor> out;
  for (const auto& [name, entry] : file.entries()) out[name] = file.get(name).clone();
  return out;
}

}  // namespace

TEST(DeepSeekV4Parity, LogitsLossAndEveryGradientMatchTransformers) {
  std::ifstream config(std::string(kFolder) + "/config.json");
  const v4::DeepSeekV4Args a = v4::args_from_hf_config(nlohmann::json::parse(config), "config.json");
  v4::Transformer model(a);
  const std::map<std::string, Tensor> hf = read_all(std::string(kFolder) + "/model.safetensors");
  std::map<std::string, Tensor> state = v4::state_from_hf(hf, "model.safetensors");
  // The MoE's expert-load counts are run-time statistics, not in a Hugging Face checkpoint.
  for (const nn::BufferKind kind : {nn::BufferKind::step_statistic, nn::BufferKind::saved_statistic})
    for (const auto& [name, t] : model.named_buffers(kind)) state.try_emplace(name, t);
  model.load_state_dict(state, /*strict=*/true, "model.safetensors");

  const auto golden = checkpoint::SafetensorsFile::open(std::string(kFolder) + "/golden.safetensors");
  const Tensor tokens = golden.get("input_ids").clone();
  const int64_t b = tokens.size(0), s = tokens.size(1);
  Tensor targets = Tensor::empty({b * s}, DType::i32);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t)
      targets.data<int32_t>()[r * s + t] = t + 1 < s ? tokens.data<int32_t>()[r * s + t + 1] : -100;

  Variable logits = model.forward(tokens);
  EXPECT_LT(test::relative_error(logits.value(), golden.get("logits")), 1e-5) << "logits";
  Variable loss = model.next_token_loss(logits, targets);
  EXPECT_NEAR(loss.value().item(), golden.get("loss").item(), 1e-5 * std::fabs(golden.get("loss").item())) << "loss";
  autograd::backward(loss);

  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : model.named_parameters())
    grads[name] = p->var.grad().defined() ? p->var.grad() : Tensor::zeros(p->var.shape(), DType::f32);
  const std::map<std::string, Tensor> hf_grads = v4::state_to_hf(grads);
  int checked = 0;
  for (const auto& [name, g] : hf_grads) {
    ASSERT_TRUE(golden.contains("grad." + name)) << name << ": the adapter's name is not transformers'";
    const bool hyper_connection = name.find("hc_head.") != std::string::npos || name.find("_hc.") != std::string::npos;
    EXPECT_LT(test::relative_error(g, golden.get("grad." + name)), hyper_connection ? 3e-4 : 1e-5) << name;
    ++checked;
  }
  EXPECT_EQ(checked, int(std::count_if(golden.entries().begin(), golden.entries().end(),
                                           [](const auto& e) { return e.first.rfind("grad.", 0) == 0; })));
}
