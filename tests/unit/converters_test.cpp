// [model] converters (models/converters.h): the names each family accepts, the defaults (what
// titan ran before the switch), per-op and global choices, the refusals, and that a built model's
// modules run the chosen forms.
#include <gtest/gtest.h>

#include "common/error_of.h"
#include "titan/models/converters.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/family.h"
#include "titan/models/moe/moe.h"

using namespace titan;
using test::error_of;
using models::Converters;
using models::OpForm;

namespace {
const std::vector<std::string> kAll = {"rms_norm", "rope", "grouped_mm", "permute", "dsa"};

Converters parse(const std::vector<std::string>& names) { return models::converters_from_names(names, "m", kAll); }
}  // namespace

TEST(Converters, DefaultsAreTheKernelsTitanRanBefore) {
  const Converters c = parse({});
  EXPECT_EQ(c.rms_norm, OpForm::fused);
  EXPECT_EQ(c.rope, OpForm::fused);
  EXPECT_EQ(c.grouped_mm, OpForm::fused);
  EXPECT_EQ(c.permute, OpForm::fused);
  EXPECT_EQ(c.dsa, OpForm::small_ops);
  EXPECT_EQ(parse({"dsa_fused"}).dsa, OpForm::fused);
  EXPECT_EQ(parse({"dsa_fused"}).rms_norm, OpForm::fused);  // existing configs keep their kernels
}

TEST(Converters, PerOpAndGlobalChoices) {
  const Converters small = parse({"small_ops"});
  for (OpForm f : {small.rms_norm, small.rope, small.grouped_mm, small.permute, small.dsa}) EXPECT_EQ(f, OpForm::small_ops);
  const Converters mixed = parse({"small_ops", "permute_fused", "dsa_fused"});
  EXPECT_EQ(mixed.permute, OpForm::fused);
  EXPECT_EQ(mixed.dsa, OpForm::fused);
  EXPECT_EQ(mixed.rms_norm, OpForm::small_ops);
  const Converters one = parse({"rope_small_ops"});
  EXPECT_EQ(one.rope, OpForm::small_ops);
  EXPECT_EQ(one.rms_norm, OpForm::fused);
}

TEST(Converters, UnknownAndContradictoryNamesAreRefused) {
  const std::string e = error_of([] { parse({"npu_rms_norm"}); });
  EXPECT_NE(e.find("model.converters"), std::string::npos) << e;
  EXPECT_NE(e.find("npu_rms_norm"), std::string::npos) << e;
  EXPECT_NE(e.find("rms_norm_fused"), std::string::npos) << e;  // the hint lists the known ones
  EXPECT_NE(error_of([] { parse({"rope_fused", "rope_small_ops"}); }).find("rope_small_ops"), std::string::npos);
  // A family accepts only its own ops: llama3 has no experts and no DSA.
  models::ModelOptions o;
  o.converters = {"grouped_mm_fused"};
  const std::string llama = error_of([&] { models::build_model("llama3", "debugmodel", 64, 16, o); });
  EXPECT_NE(llama.find("grouped_mm_fused"), std::string::npos) << llama;
  EXPECT_NE(llama.find("rope_small_ops"), std::string::npos) << llama;
  for (const models::ModelFamily* f : models::model_families())
    for (const std::string& n : models::converter_names(f->converters)) {
      models::ModelOptions ok;
      ok.converters = {n};
      EXPECT_NO_THROW(models::build_model(f->name, "debugmodel", 64, 16, ok)) << f->name << " " << n;
    }
}

TEST(Converters, BuiltModelsRunTheChosenForms) {
  for (const std::vector<std::string>& names : {std::vector<std::string>{}, std::vector<std::string>{"small_ops"}}) {
    models::ModelOptions o;
    o.converters = names;
    const OpForm want = names.empty() ? OpForm::fused : OpForm::small_ops;
    auto model = models::build_model("deepseek_v32", "debugmodel", 64, 16, o);
    int norms = 0, ropes = 0;
    model->apply([&](nn::Module& m) {
      if (auto* n = dynamic_cast<nn::RMSNorm*>(&m)) {
        EXPECT_EQ(n->form, want);
        ++norms;
      }
      if (auto* r = dynamic_cast<models::AppliesRope*>(&m)) {
        EXPECT_EQ(r->rope_form, want);
        ++ropes;
      }
    });
    EXPECT_GT(norms, 0);
    EXPECT_GT(ropes, 0);
  }
}

// DeepSeek-V4's switchable ops: every hyper-connection (and the HyperHead) and every compressor
// (an indexer's too) takes the chosen form.
TEST(Converters, DeepSeekV4ModulesRunTheChosenForms) {
  for (const std::vector<std::string>& names : {std::vector<std::string>{}, std::vector<std::string>{"small_ops"},
                                                std::vector<std::string>{"hyper_connection_small_ops", "compressor_small_ops"}}) {
    models::ModelOptions o;
    o.converters = names;
    const OpForm want = names.empty() ? OpForm::fused : OpForm::small_ops;
    auto model = models::build_model("deepseek_v4", "debugmodel", 64, 64, o);
    int switchable = 0;
    model->apply([&](nn::Module& m) {
      if (auto* op = dynamic_cast<models::SwitchableOp*>(&m)) {
        EXPECT_EQ(op->form, want) << op->converter_op();
        ++switchable;
      }
    });
    // two hyper-connections per layer and the HyperHead; 5 compressors and 3 CSA indexers
    EXPECT_EQ(switchable, 2 * 6 + 1 + 5 + 3);
  }
}
