// Small valid inputs written by the project's own writers: a two-rank checkpoint and a folder of
// token shards. The checkpoint and train-state targets read the fuzzed file next to them (the
// fuzzed metadata.json names these shard files; a fuzzed data position restores onto these
// shards), and fuzz_make_seeds writes the seed corpora from the same functions, so the seeds'
// checksums, sample counts and sequence length match what the targets find.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/checkpoint.h"
#include "titan/core/tensor.h"
#include "titan/data/loader.h"
#include "titan/data/shard.h"

namespace titan::fuzz {

inline constexpr int kFixtureSeqLen = 8;

// Two shards of a few documents (vocab 300, BOS 0, EOS 1) in `dir`: 7 samples of kFixtureSeqLen.
inline data::DataLoaderOptions write_fixture_shards(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  for (int s = 0; s < 2; ++s) {
    data::ShardWriter writer((dir / ("shard-" + std::to_string(s) + ".bin")).string(), 300, 0, 1);
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> doc(size_t(5 + 3 * d + s));
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(2 + (37 * (i + 1) + 11 * d + 101 * s) % 298);
      writer.add_document(doc);
    }
    writer.finish();
  }
  data::DataLoaderOptions options;
  options.dir = dir.string();
  options.seq_len = kFixtureSeqLen;
  options.seed = 7;
  return options;
}

// What the trainer writes as train_state.json for `loader` at `step`.
inline nlohmann::json fixture_train_state(const data::DataLoader& loader, int64_t step) {
  return {{"step", step}, {"data", loader.state()}, {"seed", 0}};
}

// step-1/ under root as two ranks save it: "model.w" f32 [4, 3] split by rows (a piece per rank),
// "model.b" bf16 [5] on rank 0 alone, "optim.step" i64 [1]. Returns the step folder.
inline std::filesystem::path write_fixture_checkpoint(const std::filesystem::path& root,
                                                      const nlohmann::json& train_state = nlohmann::json::object()) {
  auto filled = [](const Shape& shape, DType dtype, double first) {
    Tensor t = Tensor::zeros(shape, dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::f32) t.data<float>()[i] = float(first + 0.5 * double(i));
      if (dtype == DType::bf16) t.data<bf16>()[i] = f32_to_bf16(float(first - double(i)));
      if (dtype == DType::i64) t.data<int64_t>()[i] = int64_t(first) + i;
    }
    return t;
  };
  const Shape w_global{4, 3};
  checkpoint::SaveRequest rank0, rank1;
  rank0.step = rank1.step = 1;
  rank0.tensors = {{"model.w", filled({2, 3}, DType::f32, 1.0), {w_global, {0, 0}}},
                   {"model.b", filled({5}, DType::bf16, 2.0), {}},
                   {"optim.step", filled({1}, DType::i64, 1.0), {}}};
  rank1.tensors = {{"model.w", filled({2, 3}, DType::f32, 4.0), {w_global, {2, 0}}}};
  rank0.train_state = train_state;
  rank0.config_toml = "[training]\nsteps = 2\n";
  const std::filesystem::path tmp = checkpoint::staging_folder(root, 1);
  std::filesystem::create_directories(tmp);
  const std::vector<std::string> pieces = {checkpoint::write_shard(tmp, rank0, 0), checkpoint::write_shard(tmp, rank1, 1)};
  return checkpoint::commit_checkpoint(root, rank0, pieces, 2);
}

}  // namespace titan::fuzz
