#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "titan/checkpoint/checkpoint.h"

using namespace titan;
using namespace titan::checkpoint;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("titan_ckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
SaveRequest request(int64_t step) {
  SaveRequest r;
  r.step = step;
  Tensor w = Tensor::empty({4, 5}, DType::f32);
  for (int i = 0; i < 20; ++i) w.data<float>()[i] = float(i + step);
  r.tensors.push_back({"model.w", w, {}});
  r.tensors.push_back({"optim.step", Tensor::full({1}, double(step), DType::i64), {}});
  r.train_state = {{"step", step}, {"data", {{"epoch", 1}, {"position", 99}}}};
  r.config_toml = "[training]\nsteps = 10\n";
  return r;
}
}  // namespace

TEST(Checkpoint, SaveLoadLatestAndKeep) {
  const fs::path root = fresh_dir("basic");
  for (int64_t s : {10, 20, 30}) save_checkpoint(root, request(s));
  fs::create_directories(root / "step-40.tmp");  // an interrupted save is never "latest"
  ASSERT_TRUE(latest_checkpoint(root).has_value());
  EXPECT_EQ(latest_checkpoint(root)->filename(), "step-30");
  LoadedCheckpoint c = load_checkpoint(*latest_checkpoint(root));
  EXPECT_EQ(c.step, 30);
  EXPECT_EQ(c.tensors.at("model.w").at({3, 4}), 19 + 30);
  EXPECT_EQ(c.train_state["data"]["position"], 99);
  EXPECT_EQ(c.config_toml, "[training]\nsteps = 10\n");
  keep_latest(root, 2);
  EXPECT_FALSE(fs::exists(root / "step-10"));
  EXPECT_TRUE(fs::exists(root / "step-20"));
  fs::remove_all(root);
}

TEST(Checkpoint, PiecesAssembleIntoGlobalTensorsAndSlicesReadAcrossThem) {
  // Two row pieces of a [4, 3] tensor in two files, as two ranks write them (metadata stitched by
  // hand here; tests/distributed saves them from real ranks): the reader assembles the whole
  // tensor and reads a slice that spans both files.
  const fs::path root = fresh_dir("slices");
  SaveRequest r = request(1);
  r.tensors = {{"a", Tensor::full({2, 3}, 1, DType::f32), {}}};
  const fs::path dir = save_checkpoint(root, r);
  SaveRequest r2 = request(2);
  r2.tensors = {{"a", Tensor::full({2, 3}, 2, DType::f32), {}}};
  const fs::path dir2 = save_checkpoint(root, r2);
  fs::copy_file(dir2 / "shard-00000.safetensors", dir / "shard-00001.safetensors");
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "metadata.json"));
  nlohmann::json meta2 = nlohmann::json::parse(std::ifstream(dir2 / "metadata.json"));
  auto second = meta2["tensors"]["a"]["shards"][0];
  second["file"] = "shard-00001.safetensors";
  second["offsets"] = {2, 0};
  meta["tensors"]["a"]["shape"] = {4, 3};
  meta["tensors"]["a"]["shards"].push_back(second);
  std::ofstream(dir / "metadata.json") << meta.dump();
  LoadedCheckpoint c = load_checkpoint(dir);
  EXPECT_EQ(c.tensors.at("a").shape(), Shape({4, 3}));
  EXPECT_EQ(c.tensors.at("a").at({1, 2}), 1);
  EXPECT_EQ(c.tensors.at("a").at({3, 0}), 2);
  CheckpointReader reader(dir);
  Tensor middle = Tensor::zeros({2, 2}, DType::f32);  // rows 1-2, columns 1-2
  const GlobalSlice slice{{4, 3}, {1, 1}};
  reader.read("a", middle, &slice);
  EXPECT_EQ(middle.at({0, 0}), 1);
  EXPECT_EQ(middle.at({1, 1}), 2);
  // A piece whose file is gone is named.
  fs::remove(dir / "shard-00001.safetensors");
  CheckpointReader broken(dir);
  try {
    broken.read_full("a");
    FAIL() << "a missing shard file was not noticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard-00001.safetensors but the file is missing"), std::string::npos) << e.what();
  }
  // Saving pieces that do not tile their tensor is refused before anything is committed.
  SaveRequest partial = request(3);
  partial.tensors = {{"b", Tensor::full({2, 3}, 1, DType::f32), {{4, 3}, {0, 0}}}};
  EXPECT_THROW(save_checkpoint(root, partial), Error);
  EXPECT_FALSE(fs::exists(root / "step-3" / "metadata.json"));
  fs::remove_all(root);
}

TEST(Checkpoint, CorruptionIsDetectedAndNamed) {
  const fs::path root = fresh_dir("corrupt");
  const fs::path dir = save_checkpoint(root, request(5));
  {
    std::fstream f(dir / "shard-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  try {
    load_checkpoint(dir);
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shard-00000.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optim.step"), std::string::npos) << e.what();
  }
  // The corrupt bytes are the optimizer's: a load of the model weights alone neither reads nor
  // checks them (titan generate, ckpt convert --to-hf).
  const LoadedCheckpoint weights = load_checkpoint(dir, [](const std::string& n) { return n.starts_with("model."); });
  EXPECT_EQ(weights.tensors.size(), 1u);
  EXPECT_EQ(weights.tensors.at("model.w").at({3, 4}), 19 + 5);
  fs::remove(dir / "metadata.json");
  EXPECT_THROW(load_checkpoint(dir), Error);
  EXPECT_FALSE(latest_checkpoint(root).has_value());
  fs::remove_all(root);
}

// A metadata.json whose JSON parses but whose entries are damaged is CorruptCheckpoint on open,
// naming the tensor (the trainer falls back from it to the step before), never nlohmann's
// exception from a later read nor an overflow. fuzz_checkpoint_metadata found the first case: a
// tensor whose "dtype" key lost its name threw json::out_of_range from read_full().
TEST(Checkpoint, DamagedMetadataIsCorruptCheckpointOnOpen) {
  const fs::path root = fresh_dir("damaged_meta");
  const fs::path dir = save_checkpoint(root, request(5));
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(dir / "metadata.json"));
  const auto message_opening = [&](const std::function<void(nlohmann::json&)>& damage) {
    nlohmann::json meta = good;
    damage(meta);
    std::ofstream(dir / "metadata.json") << meta.dump();
    try {
      CheckpointReader reader(dir);
      for (const std::string& name : reader.names()) reader.read_full(name);
    } catch (const CorruptCheckpoint& e) {
      return e.message();
    }
    return std::string("(no CorruptCheckpoint)");
  };
  const auto w = [](nlohmann::json& m) -> nlohmann::json& { return m["tensors"]["model.w"]; };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[&](nlohmann::json& m) {
         w(m)[""] = w(m)["dtype"];
         w(m).erase("dtype");
       },
       "tensor 'model.w' has no dtype"},
      {[&](nlohmann::json& m) { w(m)["dtype"] = "f31"; }, "tensor 'model.w' has an unknown dtype \"f31\""},
      {[&](nlohmann::json& m) { w(m)["shape"] = {4, "5"}; }, "tensor 'model.w' has a bad shape"},
      {[&](nlohmann::json& m) { w(m)["shape"] = {4, -5}; }, "tensor 'model.w' has a bad shape"},
      {[&](nlohmann::json& m) { w(m)["shape"] = {int64_t(1) << 40, int64_t(1) << 40}; }, "tensor 'model.w' has a bad shape"},
      {[&](nlohmann::json& m) { w(m)["shards"] = nlohmann::json::object(); }, "tensor 'model.w' lists no pieces"},
      {[&](nlohmann::json& m) { w(m)["shards"][0].erase("xxh64"); }, "tensor 'model.w' has a malformed piece"},
      {[&](nlohmann::json& m) { w(m)["shards"][0]["offsets"] = {0}; }, "has a piece of another rank than its [4, 5]"},
      {[&](nlohmann::json& m) { w(m)["shards"][0]["offsets"] = {1, 0}; }, "has a piece outside its [4, 5]"},
      {[&](nlohmann::json& m) { w(m)["shards"][0]["file"] = "../shard-00000.safetensors"; }, "outside the step folder"},
      {[&](nlohmann::json& m) { m["step"] = 1.5; }, "\"step\" is 1.5"},
      {[&](nlohmann::json& m) { m["world_size"] = "2"; }, "\"world_size\" is \"2\""},
      {[&](nlohmann::json& m) { m["format"] = 7; }, "not a titan checkpoint (format field)"},
      {[&](nlohmann::json& m) { m["tensors"] = nlohmann::json::array(); }, "\"tensors\" is not an object"},
  };
  for (const auto& [damage, expected] : cases) {
    const std::string message = message_opening(damage);
    EXPECT_NE(message.find(expected), std::string::npos) << "expected \"" << expected << "\", got: " << message;
    EXPECT_NE(message.find("metadata.json"), std::string::npos) << message;
  }
  // Another version is not damage but a format this build does not read: an Error all the same.
  nlohmann::json other = good;
  other["version"] = "1";
  std::ofstream(dir / "metadata.json") << other.dump();
  EXPECT_THROW(CheckpointReader{dir}, Error);
  std::ofstream(dir / "metadata.json") << good.dump();
  EXPECT_EQ(load_checkpoint(dir).tensors.at("model.w").at({3, 4}), 19 + 5);
  fs::remove_all(root);
}

// train_state.json is an object its readers look fields up in: anything else is CorruptCheckpoint
// (null, a save without a train state, reads as {}).
TEST(Checkpoint, TrainStateThatIsNotAnObjectIsCorrupt) {
  const fs::path root = fresh_dir("train_state");
  const fs::path dir = save_checkpoint(root, request(5));
  std::ofstream(dir / "train_state.json") << "[1, 2]";
  EXPECT_THROW(load_train_state(dir), CorruptCheckpoint);
  std::ofstream(dir / "train_state.json") << "null";
  EXPECT_EQ(load_train_state(dir), nlohmann::json::object());
  fs::remove_all(root);
}

// A folder named like a step beyond int64 is not a step (it threw std::out_of_range from stoll).
TEST(Checkpoint, StepFolderNumberBeyondInt64IsIgnored) {
  const fs::path root = fresh_dir("huge_step");
  save_checkpoint(root, request(5));
  fs::create_directories(root / "step-99999999999999999999");
  std::ofstream(root / "step-99999999999999999999" / "metadata.json") << "{}";
  ASSERT_TRUE(latest_checkpoint(root).has_value());
  EXPECT_EQ(latest_checkpoint(root)->filename(), "step-5");
  keep_latest(root, 1);
  fs::remove_all(root);
}
