// [quantize.*] and the quantize.* converters (models/quantize.h): the config's keys read back,
// the modules each converter selects in llama3 and deepseek_v3, the refusals with their keys, and
// that a quantized Linear caches its weight's forms per parameters epoch.
#include <gtest/gtest.h>

#include <set>

#include "common/error_of.h"
#include "titan/models/family.h"
#include "titan/models/quantize.h"
#include "titan/nn/layers.h"
#include "titan/train/config.h"
#include "titan/train/trainer.h"

using namespace titan;
using autograd::LowPrecision;
using test::error_of;

namespace {
train::JobConfig parse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return train::parse_config(toml, "test.toml", overrides);
}

std::set<std::string> quantized(const std::string& model, const models::QuantizeOptions& q) {
  auto m = models::build_model(model, "debugmodel", 64, 128, models::ModelOptions{});
  std::set<std::string> names;
  for (const auto& [name, recipe] : models::apply_quantize(*m, q)) names.insert(name);
  return names;
}

bool has(const std::set<std::string>& s, const std::string& part) {
  for (const std::string& n : s)
    if (n.find(part) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST(QuantizeRecipes, TorchTitanKeysReadBackAndSelectTheRecipe) {
  const train::JobConfig c = parse(R"(
[model]
name = "llama3"
converters = ["quantize.linear.mx"]
[training]
seq_len = 256
[quantize.linear.mx]
recipe_name = "mxfp4"
filter_fqns = ["output", "wo"]
)");
  EXPECT_EQ(c.quantize_linear_mx.recipe_name, "mxfp4");
  EXPECT_EQ(c.quantize_linear_mx.filter_fqns, (std::vector<std::string>{"output", "wo"}));
  EXPECT_EQ(parse(train::to_toml(c)), c);  // the resolved TOML's dotted sections read back
  const models::QuantizeOptions q = train::quantize_options(c);
  ASSERT_TRUE(q.linear.has_value());
  EXPECT_FALSE(q.grouped_mm.has_value());
  EXPECT_EQ(q.linear->recipe, LowPrecision::mxfp4);
  // Overrides reach a dotted section's key.
  EXPECT_EQ(parse("", {"--quantize.linear.float8.filter_fqns=a,b"}).quantize_linear_float8.filter_fqns,
            (std::vector<std::string>{"a", "b"}));
  // Without a quantize.* converter nothing is selected.
  EXPECT_FALSE(train::quantize_options(parse("")).any());
}

TEST(QuantizeRecipes, LinearConverterSelectsProjectionsNotHeadRouterOrExperts) {
  models::QuantizeOptions q;
  q.linear = models::QuantizeSelection{LowPrecision::fp8_blockwise, {"output", "wo"}};
  const std::set<std::string> llama = quantized("llama3", q);
  EXPECT_TRUE(has(llama, "attention.wq")) << llama.size();
  EXPECT_TRUE(has(llama, "feed_forward.w1"));
  EXPECT_FALSE(has(llama, "output"));
  EXPECT_FALSE(has(llama, ".wo"));
  EXPECT_FALSE(has(llama, "embed"));
  EXPECT_FALSE(has(llama, "norm"));

  q.linear->fqns = {"output"};
  const std::set<std::string> ds = quantized("deepseek_v3", q);
  EXPECT_TRUE(has(ds, "attention.wq"));
  EXPECT_TRUE(has(ds, "shared_experts.w1"));  // shared experts: FP8 with attention
  EXPECT_FALSE(has(ds, "router"));            // the router stays f32
  EXPECT_FALSE(has(ds, "wkv_b"));             // read directly by the attention kernels
  EXPECT_FALSE(has(ds, "experts.w1") && !has(ds, "shared_experts.w1"));
  for (const std::string& n : ds) EXPECT_TRUE(n.find("moe.experts") == std::string::npos) << n;
  EXPECT_FALSE(has(ds, "output"));
}

TEST(QuantizeRecipes, BadKeysNameTheKeyAndTheFix) {
  const std::string recipe = error_of([] { parse("[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n"); });
  EXPECT_NE(recipe.find("recipe_name"), std::string::npos) << recipe;
  EXPECT_NE(recipe.find("blockwise"), std::string::npos) << recipe;
  const std::string section = error_of([] { parse("[quantize.linear.fp8]\nrecipe_name = \"blockwise\"\n"); });
  EXPECT_NE(section.find("quantize.linear.fp8"), std::string::npos) << section;
  const std::string key = error_of([] { parse("[quantize.linear.mx]\nfilter = [\"output\"]\n"); });
  EXPECT_NE(key.find("filter"), std::string::npos) << key;
  const std::string name = error_of([] {
    models::ModelOptions o;
    o.converters = {"quantize.linear.fp8"};
    models::build_model("llama3", "debugmodel", 64, 128, o);
  });
  EXPECT_NE(name.find("quantize.linear.fp8"), std::string::npos) << name;
  EXPECT_NE(name.find("quantize.linear.float8"), std::string::npos) << name;  // the hint lists them
  const std::string both = error_of([] {
    train::quantize_options(parse("[model]\nconverters = [\"quantize.linear.float8\", \"quantize.linear.mx\"]\n"
                                  "[training]\nseq_len = 256\n"));
  });
  EXPECT_NE(both.find("quantize.linear.mx"), std::string::npos) << both;
  const std::string tp = error_of([] {
    parse("[model]\nconverters = [\"quantize.linear.float8\"]\n[training]\nseq_len = 256\n"
          "[parallelism]\ntensor_parallel_degree = 2\n");
  });
  EXPECT_NE(tp.find("tensor_parallel_degree"), std::string::npos) << tp;
  const std::string seq = error_of([] { parse("[model]\nconverters = [\"quantize.linear.mx\"]\n[training]\nseq_len = 100\n"); });
  EXPECT_NE(seq.find("seq_len"), std::string::npos) << seq;
  EXPECT_NE(seq.find("128"), std::string::npos) << seq;
  // FP8 all-gather: needs the FP8 blockwise linears and FSDP.
  const std::string gather_mx = error_of([] {
    parse("[model]\nconverters = [\"quantize.linear.mx\"]\n[training]\nseq_len = 256\n"
          "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n");
  });
  EXPECT_NE(gather_mx.find("enable_fsdp_float8_all_gather"), std::string::npos) << gather_mx;
  EXPECT_NE(gather_mx.find("quantize.linear.float8"), std::string::npos) << gather_mx;
  const std::string gather_ddp = error_of([] {
    parse("[model]\nconverters = [\"quantize.linear.float8\"]\n[training]\nseq_len = 256\n"
          "[parallelism]\ndata_parallel_shard_degree = 1\n[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n");
  });
  EXPECT_NE(gather_ddp.find("enable_fsdp_float8_all_gather"), std::string::npos) << gather_ddp;
  EXPECT_NE(gather_ddp.find("data_parallel_shard_degree"), std::string::npos) << gather_ddp;
  EXPECT_TRUE(parse("[model]\nconverters = [\"quantize.linear.float8\"]\n[training]\nseq_len = 256\n"
                    "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n")
                  .quantize_linear_float8.enable_fsdp_float8_all_gather);
  // quantize.grouped_mm.*: a dense model, fqns matching no routed experts, the small-op forms.
  models::QuantizeOptions experts;
  experts.grouped_mm = models::QuantizeSelection{LowPrecision::mxfp4, {"experts"}};
  const std::string dense = error_of([&] { quantized("llama3", experts); });
  EXPECT_NE(dense.find("quantize.grouped_mm.mx"), std::string::npos) << dense;
  EXPECT_NE(dense.find("no routed experts"), std::string::npos) << dense;
  experts.grouped_mm->fqns = {"layers.99."};
  const std::string none = error_of([&] { quantized("deepseek_v3", experts); });
  EXPECT_NE(none.find("fqns"), std::string::npos) << none;
  EXPECT_NE(none.find("layers.99."), std::string::npos) << none;
  const std::string small = error_of([] {
    models::ModelOptions o;
    o.converters = {"grouped_mm_small_ops", "quantize.grouped_mm.float8"};
    o.quantize.grouped_mm = models::QuantizeSelection{LowPrecision::fp8_blockwise, {"experts"}};
    models::build_model("deepseek_v3", "debugmodel", 64, 128, o);
  });
  EXPECT_NE(small.find("small-op"), std::string::npos) << small;
  EXPECT_NE(small.find("quantize.grouped_mm"), std::string::npos) << small;
}

TEST(QuantizeRecipes, GroupedMmConverterSelectsTheRoutedExperts) {
  const train::JobConfig c = parse(R"(
[model]
name = "deepseek_v3"
converters = ["quantize.linear.float8", "quantize.grouped_mm.mx"]
[training]
seq_len = 256
[quantize.grouped_mm.mx]
recipe_name = "mxfp4"
)");
  EXPECT_EQ(c.quantize_grouped_mm_mx.fqns, (std::vector<std::string>{"experts"}));  // TorchTitan's default
  const models::QuantizeOptions q = train::quantize_options(c);
  ASSERT_TRUE(q.grouped_mm.has_value());
  EXPECT_EQ(q.grouped_mm->recipe, LowPrecision::mxfp4);
  auto m = models::build_model("deepseek_v3", "debugmodel", 64, 128, models::ModelOptions{});
  models::QuantizeOptions experts_only = q;
  experts_only.linear.reset();
  std::vector<std::string> routed;
  for (const auto& [name, recipe] : models::apply_quantize(*m, experts_only))
    if (recipe == LowPrecision::mxfp4) routed.push_back(name);
  // debugmodel: layer 0 dense, layers 1 to 5 MoE; each MoE's routed experts, named as a module.
  EXPECT_EQ(routed, (std::vector<std::string>{"layers.1.moe.experts", "layers.2.moe.experts", "layers.3.moe.experts",
                                              "layers.4.moe.experts", "layers.5.moe.experts"}));
  // titan train prints them with the linear layers.
  const std::string listed = models::describe_quantized(*m);
  EXPECT_NE(listed.find("quantized mxfp4: the routed experts of 5 MoE layers (layers.1.moe.experts, "), std::string::npos)
      << listed;
  EXPECT_EQ(listed.find("quantized fp8_blockwise"), std::string::npos) << listed;  // q has no linear selection here
  // fqns narrows the choice.
  models::QuantizeOptions one = q;
  one.grouped_mm->fqns = {"layers.2.moe.experts"};
  routed.clear();
  for (const auto& [name, recipe] : models::apply_quantize(*m, one))
    if (recipe == LowPrecision::mxfp4) routed.push_back(name);
  EXPECT_EQ(routed, (std::vector<std::string>{"layers.2.moe.experts"}));
}

TEST(QuantizeRecipes, WeightFormsAreCachedPerParametersEpoch) {
  for (LowPrecision r : {LowPrecision::fp8_blockwise, LowPrecision::mxfp8, LowPrecision::mxfp4}) {
    nn::Linear lin(256, 192, nn::Init::normal(0, 0.05));
    lin.init_parameters(3);
    lin.quantize = r;
    Tensor x = Tensor::empty({2, 40, 256}, DType::f32);
    float* xp = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) xp[i] = float((i * 37) % 101) / 50.0f - 1.0f;
    const Tensor y1 = lin.forward(autograd::Variable(x)).value().contiguous();
    const void* buffer = lin.quantized.along_k.data_ptr();
    // The same values as the uncached op.
    const Tensor y0 = autograd::quantized_linear(autograd::Variable(x), lin.weight.var, r).value().contiguous();
    for (int64_t i = 0; i < y0.numel(); ++i) ASSERT_EQ(y0.data<float>()[i], y1.data<float>()[i]);
    // A change of the weight not announced: the cached forms stay (the epoch did not move) ...
    lin.weight.var.value().data<float>()[0] += 1.0f;
    const Tensor y2 = lin.forward(autograd::Variable(x)).value().contiguous();
    EXPECT_EQ(y2.data<float>()[0], y1.data<float>()[0]);
    // ... announced (the trainer does so after each optimizer step), they are recomputed in place.
    autograd::note_parameters_changed();
    const Tensor y3 = lin.forward(autograd::Variable(x)).value().contiguous();
    EXPECT_NE(y3.data<float>()[0], y1.data<float>()[0]);
    EXPECT_EQ(lin.quantized.along_k.data_ptr(), buffer);  // no new allocation
    EXPECT_GT(lin.quantized.stored_bytes(), 0);
    EXPECT_LT(lin.quantized.stored_bytes(), 256 * 192 * (r == LowPrecision::fp8_blockwise ? 2 : 3));
  }
}

// FSDP's FP8 all-gather hands a Linear the gathered codes and the whole weight's scales
// (QuantizedWeight::adopt_fp8_blockwise): the layer then computes what it computes from the weight
// itself, and once the parameters change it refuses to run on the old forms.
TEST(QuantizeRecipes, AdoptedFp8FormsEqualTheWeightsOwn) {
  nn::Linear own(256, 300, nn::Init::normal(0, 0.05)), fed(256, 300, nn::Init::normal(0, 0.05));
  own.init_parameters(5);
  own.quantize = fed.quantize = LowPrecision::fp8_blockwise;
  Tensor x = Tensor::empty({3, 256}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float((i * 29) % 97) / 48.0f - 1.0f;
  const Tensor want = own.forward(autograd::Variable(x)).value().contiguous();
  fed.weight.var.mutable_value().zero_();  // what the layer would quantize itself: not the weight
  fed.quantized.adopt_fp8_blockwise(own.quantized.codes, own.quantized.scales);
  const Tensor got = fed.forward(autograd::Variable(x)).value().contiguous();
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
  autograd::note_parameters_changed();
  const std::string stale = error_of([&] { fed.forward(autograd::Variable(x)); });
  EXPECT_NE(stale.find("FP8 all-gather"), std::string::npos) << stale;
}
