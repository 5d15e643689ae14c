// DeepSeek-V4's attention (models/deepseek_v4/attention.h) against transformers'
// DeepseekV4Attention inside the tiny model of tests/fixtures/deepseek_v4_tiny (made by
// reference/deepseek_v4_fixture.py): for a sliding-only, a CSA and an HCA layer, from the
// attention's captured input, its output and, from the captured output gradient, the input's
// gradient and every parameter's, each to 1e-5 relative (Frobenius) in f32; and each CSA
// query's indexer selection equal to transformers' as a set. transformers gives the indexer no
// gradient, and neither does this model while indexer_loss_coeff is 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v4/attention.h"
#include "titan/models/deepseek_v4/hf_adapter.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr const char* kFolder = "tests/fixtures/deepseek_v4_tiny";

v4::DeepSeekV4Args tiny_args() {
  std::ifstream in(std::string(kFolder) + "/config.json");
  return v4::args_from_hf_config(nlohmann::json::parse(in), "config.json");
}

}  // namespace

TEST(DeepSeekV4AttentionParity, EveryLayerKindMatchesTransformers) {
  const v4::DeepSeekV4Args a = tiny_args();
  // The folder as save_pretrained wrote it, read through the Hugging Face adapter.
  std::map<std::string, Tensor> hf;
  {
    const auto file = checkpoint::SafetensorsFile::open(std::string(kFolder) + "/model.safetensors");
    for (const auto& [name, entry] : file.entries()) hf[name] = file.get(name).clone();
  }
  const std::map<std::string, Tensor> model = v4::state_from_hf(hf, "model.safetensors");
  const auto golden = checkpoint::SafetensorsFile::open(std::string(kFolder) + "/golden.safetensors");
  const Tensor in0 = golden.get("attn.0.in");
  const int64_t b = in0.size(0), s = in0.size(1), d = in0.size(2);
  Tensor positions = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < b * s; ++i) positions.data<int32_t>()[i] = int32_t(i % s);

  for (int64_t l = 0; l < a.n_layers; ++l) {
    const v4::LayerType type = a.layer_types[size_t(l)];
    SCOPED_TRACE("layer " + std::to_string(l) + " (" + v4::layer_type_name(type) + ")");
    const std::string prefix = "layers." + std::to_string(l) + ".self_attn.";
    const std::string at = "attn." + std::to_string(l);
    v4::Attention attn(a, type);
    std::map<std::string, Tensor> state;
    for (const auto& [name, p] : attn.named_parameters()) state[name] = model.at(prefix + name);
    attn.load_state_dict(state, /*strict=*/true, "model.safetensors");
    const kernels::RopeTables rope = kernels::rope_tables(a.rope(type), a.max_seq_len);

    Variable h(golden.get(at + ".in").clone().view({b * s, d}), true);
    Variable out = attn.forward(h, positions, rope, nullptr);
    EXPECT_LT(test::relative_error(out.value(), golden.get(at + ".out")), 1e-5) << "output";
    autograd::backward(out, golden.get(at + ".dout").clone().view({b * s, d}));
    EXPECT_LT(test::relative_error(h.grad(), golden.get(at + ".din")), 1e-5) << "input gradient";
    for (const auto& [name, p] : attn.named_parameters()) {
      const Tensor want = golden.get("grad.model." + prefix + name);
      if (name.find("indexer.") != std::string::npos) {
        EXPECT_FALSE(p->var.grad().defined()) << name << ": the indexer learns only from its own loss";
        continue;
      }
      ASSERT_TRUE(p->var.grad().defined()) << name;
      EXPECT_LT(test::relative_error(p->var.grad(), want), 1e-5) << name;
    }

    if (type != v4::LayerType::csa) continue;
    const Variable hs(golden.get(at + ".in").clone());
    const Variable qr = attn.q_a_norm.forward(attn.q_a_proj.forward(Variable(hs.value().view({b * s, d}))));
    const v4::Indexer::Selection sel =
        attn.compressor->indexer->select(hs, autograd::view(qr, {b, s, a.q_lora_rank}), rope, positions);
    const Tensor want = golden.get(at + ".topk");
    ASSERT_EQ(sel.idx.shape(), want.shape());
    const int64_t k = want.size(2);
    int64_t rows_selecting = 0;
    for (int64_t row = 0; row < b * s; ++row) {
      std::set<int32_t> ours, theirs;
      for (int64_t i = 0; i < k; ++i) {
        if (sel.idx.data<int32_t>()[row * k + i] >= 0) ours.insert(sel.idx.data<int32_t>()[row * k + i]);
        if (want.data<int32_t>()[row * k + i] >= 0) theirs.insert(want.data<int32_t>()[row * k + i]);
      }
      EXPECT_EQ(ours, theirs) << "query row " << row;
      rows_selecting += int64_t(theirs.size()) == k;
    }
    EXPECT_GT(rows_selecting, 0) << "no query had more visible entries than the top-k";
  }
}
