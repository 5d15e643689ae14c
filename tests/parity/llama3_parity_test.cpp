// Golden parity with the PyTorch reference (reference/llama3.py): same weights and batch, so
// logits, loss, every gradient and 10 AdamW steps must match within f32 tolerances.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/llama3/model.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"

using namespace titan;
using namespace titan::models::llama3;

namespace {

const char* kFixture = "tests/fixtures/llama3_golden.safetensors";

struct Golden {
  checkpoint::SafetensorsFile file;
  Llama3Args args;
  nlohmann::json adamw;
};

Golden load_golden() {
  Golden g{checkpoint::SafetensorsFile::open(kFixture), {}, {}};
  const auto a = nlohmann::json::parse(g.file.metadata().at("args"));
  g.args.dim = a["dim"];
  g.args.n_layers = a["n_layers"];
  g.args.n_heads = a["n_heads"];
  g.args.n_kv_heads = a["n_kv_heads"];
  g.args.vocab_size = a["vocab_size"];
  g.args.multiple_of = a["multiple_of"];
  g.args.norm_eps = a["norm_eps"];
  g.args.rope_theta = a["rope_theta"];
  g.args.max_seq_len = a["max_seq_len"];
  g.args.rope_llama3_scaling = a["rope_llama3_scaling"];
  g.adamw = nlohmann::json::parse(g.file.metadata().at("adamw"));
  return g;
}

void load_params(Transformer& m, const Golden& g) {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : m.state_dict()) state[name] = g.file.get("param." + name);
  m.load_state_dict(state, true, kFixture);
}

void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  const auto e = test::compare(test::to_doubles(got), test::to_doubles(want), atol, rtol);
  EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1) << what << ": max_abs " << e.max_abs << " (x" << e.max_scaled
                                                     << " of tolerance) at " << e.worst;
}

}  // namespace

// With and without activation checkpointing (full, and selective: GEMM / attention outputs kept).
TEST(Llama3Parity, LogitsLossAndGradientsMatchPyTorch) {
  Golden g = load_golden();
  for (models::Recompute rc : {models::Recompute::none, models::Recompute::full, models::Recompute::selective}) {
    const std::string mode = " (recompute " + std::to_string(int(rc)) + ")";
    Transformer model(g.args);
    load_params(model, g);
    model.set_recompute(rc);
    const Tensor tokens = g.file.get("tokens").clone(), targets = g.file.get("targets").clone();
    autograd::Variable logits = model.forward(tokens);
    expect_close(logits.value(), g.file.get("logits"), 2e-5, 1e-4, "logits" + mode);
    autograd::Variable loss = autograd::cross_entropy(logits, targets);
    EXPECT_NEAR(loss.value().item(), g.file.get("loss").item(), 1e-5);
    autograd::backward(loss);
    for (auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p->var.grad().defined()) << name << mode;
      expect_close(p->var.grad(), g.file.get("grad." + name), 1e-6, 2e-4, "grad " + name + mode);
    }
  }
}

TEST(Llama3Parity, TenAdamWStepsMatchPyTorch) {
  Golden g = load_golden();
  Transformer model(g.args);
  load_params(model, g);
  const Tensor tokens = g.file.get("tokens").clone(), targets = g.file.get("targets").clone();
  kernels::AdamWParams cfg;
  cfg.lr = g.adamw["lr"];
  cfg.beta1 = g.adamw["beta1"];
  cfg.beta2 = g.adamw["beta2"];
  cfg.eps = g.adamw["eps"];
  cfg.weight_decay = g.adamw["weight_decay"];
  optim::AdamW opt(model.named_parameters(), cfg);
  const Tensor want = g.file.get("adamw_losses");
  for (int step = 0; step < want.numel(); ++step) {
    model.zero_grad();
    autograd::Variable loss = autograd::cross_entropy(model.forward(tokens), targets);
    autograd::backward(loss);
    const auto norm = optim::clip_grad_norm(model.named_parameters(), g.adamw["max_norm"]);
    opt.step(cfg.lr, norm.scale);
    // f32 vs the float64 reference: differences grow slowly with the steps taken.
    EXPECT_NEAR(loss.value().item(), want.at({step}), 2e-4 * (1 + step)) << "step " << step;
  }
}

// bf16 activations with f32 master weights, with and without activation checkpointing (whose
// recompute must keep the activations' gradients in bf16).
TEST(Llama3Parity, Bf16MixedPrecisionStaysClose) {
  Golden g = load_golden();
  for (models::Recompute rc : {models::Recompute::none, models::Recompute::full, models::Recompute::selective}) {
    const std::string mode = " (recompute " + std::to_string(int(rc)) + ")";
    Transformer model(g.args);
    load_params(model, g);
    model.set_compute_dtype(DType::bf16);
    model.set_recompute(rc);
    const Tensor tokens = g.file.get("tokens").clone(), targets = g.file.get("targets").clone();
    autograd::Variable logits = model.forward(tokens);
    EXPECT_EQ(logits.dtype(), DType::bf16);
    autograd::Variable loss = autograd::cross_entropy(logits, targets);
    EXPECT_NEAR(loss.value().item(), g.file.get("loss").item(), 2e-2) << mode;
    autograd::backward(loss);
    for (auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(p->var.grad().dtype(), DType::f32) << name;
      expect_close(p->var.grad(), g.file.get("grad." + name), 2e-3, 0.1, "bf16 grad " + name + mode);
    }
  }
}

// KV-cached decoding (prompt, then one token at a time) gives the logits of a full forward.
TEST(Llama3Parity, CachedDecodeMatchesFullForward) {
  Golden g = load_golden();
  Transformer model(g.args);
  load_params(model, g);
  const Tensor tokens = g.file.get("tokens").clone();  // [B, S]
  const int64_t b = tokens.size(0), s = tokens.size(1), v = g.args.vocab_size;
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = model.forward(tokens).value();  // [B*S, V]
  }
  const int64_t prompt = 6;
  model.start_generation(b, s);
  Tensor logits = model.decode(tokens.slice(1, 0, prompt).contiguous());
  for (int64_t pos = prompt - 1; pos < s; ++pos) {
    if (pos >= prompt) logits = model.decode(tokens.slice(1, pos, pos + 1).contiguous());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < v; j += 7) ASSERT_NEAR(logits.at({bi, j}), full.at({bi * s + pos, j}), 1e-4) << pos;
  }
}
