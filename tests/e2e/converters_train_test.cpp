// `[model] converters` on and off train the same model: llama3, deepseek_v32 and deepseek_v4
// debug models, a few steps each with every op fused against every op in its small-op form (and,
// for deepseek_v32, the defaults), log the same losses within f32 rounding of the different sums.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

fs::path make_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream text(dir / "corpus.txt");
  const char* words[] = {"seed", "of", "the", "converters", "fused", "or", "small", "ops", "alike", "in", "loss"};
  for (int d = 0; d < 100; ++d) {
    for (int w = 0; w < 40; ++w) text << words[(d * 5 + w * 3) % 11] << (w % 9 == 8 ? ".\n" : " ");
    text << ".\n\n";
  }
  text.close();
  return test::prepare_byte_dataset(dir / "corpus.txt", dir, 0);
}

std::vector<double> losses(const fs::path& data, const fs::path& run, const std::string& model,
                           const std::string& converters) {
  const std::string toml = R"(
[job]
dump_folder = ")" + run.string() + R"("
[model]
name = ")" + model + R"("
flavor = "debugmodel"
converters = [)" + converters + R"(]
[training]
local_batch_size = 2
seq_len = 32
steps = 3
dataset_path = ")" + data.string() + R"("
mixed_precision_param = "float32"
[optimizer]
lr = 1e-3
[lr_scheduler]
warmup_steps = 1
[checkpoint]
enable = false
[metrics]
log_freq = 1
)" + (model == "deepseek_v32" ? "[dsa]\ntopk = 8\n" : "");
  train::Trainer trainer(train::parse_config(toml, "converters_train_test.toml"), run.string());
  trainer.train();
  std::vector<double> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
  }
  return out;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), 3u) << what;
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::fabs(a[i])) << what << " step " << i + 1;
}

}  // namespace

TEST(ConvertersTrainE2E, FusedAndSmallOpsGiveTheSameLosses) {
  const fs::path root = fs::temp_directory_path() / ("titan_converters_e2e_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  const std::vector<double> llama_fused = losses(data, root / "llama_fused", "llama3", R"("rms_norm_fused", "rope_fused")");
  const std::vector<double> llama_small = losses(data, root / "llama_small", "llama3", R"("small_ops")");
  expect_close(llama_fused, llama_small, "llama3");

  const std::string all_fused = R"("rms_norm_fused", "rope_fused", "grouped_mm_fused", "permute_fused", "dsa_fused")";
  const std::vector<double> ds_fused = losses(data, root / "ds_fused", "deepseek_v32", all_fused);
  const std::vector<double> ds_small = losses(data, root / "ds_small", "deepseek_v32", R"("small_ops")");
  const std::vector<double> ds_default = losses(data, root / "ds_default", "deepseek_v32", "");
  expect_close(ds_fused, ds_small, "deepseek_v32 fused vs small_ops");
  expect_close(ds_default, ds_small, "deepseek_v32 defaults vs small_ops");

  const std::string v4_all_fused = R"("grouped_mm_fused", "permute_fused", "hyper_connection_fused", "compressor_fused")";
  const std::vector<double> v4_fused = losses(data, root / "v4_fused", "deepseek_v4", v4_all_fused);
  const std::vector<double> v4_small = losses(data, root / "v4_small", "deepseek_v4", R"("small_ops")");
  expect_close(v4_fused, v4_small, "deepseek_v4 fused vs small_ops");
  fs::remove_all(root);
}
