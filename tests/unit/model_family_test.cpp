// The model registry (models/family.h): every family's spec is complete and self-consistent,
// options a family has no use for are refused by name, and no source outside src/titan/models/
// names a model (the check ARCHITECTURE.md asks for: a new family is a folder and one line).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "common/error_of.h"
#include "titan/core/allocator.h"
#include "titan/distributed/process_group.h"
#include "titan/models/family.h"
#include "titan/nn/module.h"

using namespace titan;
using test::error_of;
namespace fs = std::filesystem;

TEST(ModelFamily, EverySpecIsCompleteAndItsFlavorsBuild) {
  std::set<std::string> names;
  ASSERT_GE(models::model_families().size(), 3u);
  for (const models::ModelFamily* f : models::model_families()) {
    SCOPED_TRACE(f->name);
    EXPECT_TRUE(names.insert(f->name).second) << "registered twice";
    ASSERT_TRUE(f->flavors && f->build && f->n_layers && f->activations && f->context_parallel_traffic);
    EXPECT_EQ(f->routed_experts, f->experts_per_token != nullptr);
    EXPECT_EQ(&models::model_family(f->name), f);
    for (const std::string& flavor : f->flavors()) {
      SCOPED_TRACE(flavor);
      // Every flavor, the largest included, builds without storage; its blocks are what
      // n_layers says (the pipeline splits by it), and the activation model covers each.
      const int64_t before = memory_stats().live[size_t(MemCategory::parameters)];
      std::unique_ptr<models::CausalLM> m;
      {
        nn::ParametersWithoutStorage no_storage;
        m = f->build(flavor, 0, 0, {});
      }
      std::set<std::string> blocks;
      for (const auto& [name, p] : m->named_parameters()) {
        EXPECT_FALSE(p->var.value().storage_allocated()) << name;
        if (name.starts_with("layers.")) blocks.insert(name.substr(0, name.find('.', 7)));
      }
      const int64_t layers = f->n_layers(flavor, 0, {});
      EXPECT_EQ(int64_t(blocks.size()), layers);
      models::PlanQuery q;
      q.flavor = flavor;
      q.seq_len = 128;
      EXPECT_EQ(int64_t(f->activations(q).blocks.size()), layers);
      if (f->experts_per_token) {
        EXPECT_EQ(int64_t(f->experts_per_token(q).size()), layers);
      }
      m.reset();
      EXPECT_EQ(memory_stats().live[size_t(MemCategory::parameters)], before);
    }
  }
}

// One declarative plan per family gives both the placement and the local shapes: the layers
// declare every parameter whole, the plan divides it, and a rank never holds more than its
// pieces (the build's peak is what it keeps). Rank 1 of 2 under TP, and of 2 under EP for a
// family with routed experts; no collective runs while building, so no MPI is needed.
TEST(ModelFamily, EachRankHoldsOnlyThePiecesItsPlanGivesIt) {
  const distributed::ProcessGroup pair(0, "pair", 1, {0, 1});
  for (const models::ModelFamily* f : models::model_families()) {
    SCOPED_TRACE(f->name);
    if (!f->tensor_parallel) {  // a family without a plan refuses TP by name
      models::ModelOptions tp;
      tp.tp = &pair;
      EXPECT_NE(error_of([&] { models::build_model(f->name, "debugmodel", 256, 32, tp); }).find("tensor_parallel_degree"),
                std::string::npos);
      continue;
    }
    std::map<std::string, Shape> whole;
    {
      const auto one_rank = models::build_model(f->name, "debugmodel", 256, 32, {});
      for (const auto& [name, p] : one_rank->named_parameters()) whole[name] = p->var.shape();
    }
    models::ModelOptions options;
    options.tp = &pair;
    if (f->routed_experts) options.ep = &pair;
    const int64_t before = memory_stats().live[size_t(MemCategory::parameters)];
    memory_reset_peak();
    const auto m = models::build_model(f->name, "debugmodel", 256, 32, options);
    int divided = 0, experts = 0;
    for (const auto& [name, p] : m->named_parameters()) {
      SCOPED_TRACE(name);
      const Shape local = p->var.shape();
      const Shape global = p->slice.global_shape.empty() ? local : p->slice.global_shape;
      EXPECT_EQ(global, whole.at(name));
      for (int d = 0; d < local.size(); ++d) {
        const bool split = d == p->tp_plan.dim || (d == 0 && p->expert_sharded);
        EXPECT_EQ(local[d] * (split ? 2 : 1), global[d]) << "dim " << d;
        if (split) {
          EXPECT_EQ(p->slice.offsets[d], local[d]) << "dim " << d;  // rank 1: the second piece
        }
      }
      divided += p->tp_plan.dim >= 0;
      experts += p->expert_sharded;
    }
    EXPECT_GT(divided, 0);
    EXPECT_EQ(experts > 0, f->routed_experts);
    const MemoryStats after = memory_stats();
    EXPECT_EQ(after.peak[size_t(MemCategory::parameters)], after.live[size_t(MemCategory::parameters)]);
    EXPECT_GT(after.live[size_t(MemCategory::parameters)], before);
  }
}

// DeepSeek-V4 splits its heads and its output groups over TP (each rank whole groups of its own
// heads): the debug model's 4 heads in 2 groups run TP 1 or 2; TP 4 is refused by key and value.
TEST(ModelFamily, DeepSeekV4RefusesTensorParallelThatSplitsAnOutputGroup) {
  const distributed::ProcessGroup four(0, "four", 1, {0, 1, 2, 3});
  models::ModelOptions tp;
  tp.tp = &four;
  const std::string e = error_of([&] { models::build_model("deepseek_v4", "debugmodel", 256, 32, tp); });
  EXPECT_NE(e.find("parallelism.tensor_parallel_degree = 4 does not divide deepseek_v4's 2 output groups (o_groups)"),
            std::string::npos) << e;
  EXPECT_NE(e.find(": 1, 2"), std::string::npos) << e;  // the degrees that work
}

TEST(ModelFamily, AnUnknownNameListsTheRegisteredOnes) {
  const std::string e = error_of([] { models::model_family("gpt2"); });
  for (const std::string& n : models::model_names()) EXPECT_NE(e.find(n), std::string::npos) << e;
}

TEST(ModelFamily, OptionsTheFamilyLacksAreRefusedByKey) {
  for (const models::ModelFamily* f : models::model_families()) {
    SCOPED_TRACE(f->name);
    models::ModelOptions mtp;
    mtp.mtp_layers = 1;
    models::ModelOptions dsa;
    dsa.dsa.warmup_steps = 3;
    models::ModelOptions converters;
    converters.converters = {"dsa_fused"};
    if (!f->multi_token_prediction) {
      EXPECT_NE(error_of([&] { models::build_model(f->name, "debugmodel", 256, 32, mtp); }).find("model.mtp_layers"),
                std::string::npos);
    }
    if (!f->sparse_attention) {
      EXPECT_NE(error_of([&] { models::build_model(f->name, "debugmodel", 256, 32, dsa); }).find("[dsa]"), std::string::npos);
      EXPECT_NE(error_of([&] { models::build_model(f->name, "debugmodel", 256, 32, converters); }).find("model.converters"),
                std::string::npos);
    }
  }
}

// "Nothing outside models/ compares a model's name": no source file outside src/titan/models/
// holds a registered name as a string literal. The one exception is the tokenizer's
// pre-tokenizer styles, which Hugging Face names after model families (PreTokenizerStyle).
TEST(ModelFamily, NoSourceOutsideModelsNamesAModel) {
  const fs::path root = fs::path("src") / "titan";
  ASSERT_TRUE(fs::is_directory(root)) << "run from the repository root (ctest sets the working directory)";
  std::vector<std::string> found;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu")) continue;
    if (fs::relative(entry.path(), root).begin()->string() == "models") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find("PreTokenizerStyle::") != std::string::npos) continue;
      for (const std::string& name : models::model_names())
        if (line.find('"' + name + '"') != std::string::npos)
          found.push_back(entry.path().string() + ":" + std::to_string(n) + ": " + line);
    }
  }
  EXPECT_GT(files, 50);
  std::string all;
  for (const std::string& f : found) all += f + "\n";
  EXPECT_TRUE(found.empty()) << all;
}
