#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <functional>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "titan/checkpoint/checkpoint.h"
#include "titan/train/checkpointing.h"

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
  // An empty slice reads nothing wherever it starts: FSDP places the ranks past the end of a
  // tensor smaller than its group there (4 ranks of a [4, 3] tensor's 1-row chunks at 8 ranks).
  Tensor none = Tensor::zeros({0, 3}, DType::f32);
  const GlobalSlice beyond{{4, 3}, {6, 0}};
  EXPECT_NO_THROW(reader.read("a", none, &beyond));
  Tensor past = Tensor::zeros({1, 3}, DType::f32);
  const GlobalSlice overrun{{4, 3}, {4, 0}};
  EXPECT_THROW(reader.read("a", past, &overrun), Error);  // a row past the end is still refused
  // Overlapping pieces are damage on open: moved one row up, the second piece overlaps the first
  // and leaves row 3 unread (the sum of the overlaps used to pass for coverage).
  nlohmann::json overlapping = meta;
  overlapping["tensors"]["a"]["shards"][1]["offsets"] = {1, 0};
  std::ofstream(dir / "metadata.json") << overlapping.dump();
  try {
    CheckpointReader reader2(dir);
    FAIL() << "overlapping pieces were not noticed";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(e.message().find("tensor 'a' has two pieces that overlap"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "metadata.json") << meta.dump();
  // A piece whose file is gone is named, as an I/O error (it may be hidden from this process
  // only), with the file: the trainer asks rank 0 whether it is lost.
  fs::remove(dir / "shard-00001.safetensors");
  CheckpointReader broken(dir);
  try {
    broken.read_full("a");
    FAIL() << "a missing shard file was not noticed";
  } catch (const CheckpointIOError& e) {
    EXPECT_NE(e.message().find("shard-00001.safetensors: No such file"), std::string::npos) << e.what();
    EXPECT_EQ(e.missing(), dir / "shard-00001.safetensors");
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

// Shapes from metadata.json whose bytes overflow are damage on open (an F32 [2^59 + 1] wrapped to a
// 4-byte allocation that a piece then overran), and one that fits int64 but that no file holds
// (terabytes) fails before anything is allocated.
TEST(Checkpoint, HugeShapesFailBeforeAnyAllocation) {
  const fs::path root = fresh_dir("huge");
  const fs::path dir = save_checkpoint(root, request(5));
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(dir / "metadata.json"));
  nlohmann::json meta = good;
  meta["tensors"]["model.w"]["shape"] = {(int64_t(1) << 59) + 1};
  meta["tensors"]["model.w"]["shards"][0]["shape"] = {(int64_t(1) << 59) + 1};
  meta["tensors"]["model.w"]["shards"][0]["offsets"] = {0};
  std::ofstream(dir / "metadata.json") << meta.dump();
  EXPECT_THROW(CheckpointReader{dir}, CorruptCheckpoint);
  meta = good;
  meta["tensors"]["model.w"]["shape"] = {int64_t(1) << 40};
  meta["tensors"]["model.w"]["shards"][0]["shape"] = {int64_t(1) << 40};
  meta["tensors"]["model.w"]["shards"][0]["offsets"] = {0};
  std::ofstream(dir / "metadata.json") << meta.dump();
  CheckpointReader reader(dir);
  try {
    reader.read_full("model.w");
    FAIL() << "a 4 TiB tensor no file holds was read";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(e.message().find("the file does not hold the [1099511627776] piece"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// What the operating system refuses is retried and then a CheckpointIOError, never damage: here
// no file descriptor is left (EMFILE) while the shard opens. With descriptors back, it loads.
TEST(Checkpoint, RefusedOpensAreIOErrorsNotDamage) {
  const fs::path root = fresh_dir("emfile");
  const fs::path dir = save_checkpoint(root, request(5));
  CheckpointReader reader(dir);  // metadata read; the shard opens on the first read
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::open("/dev/null", O_RDONLY);  // the next open would get this one
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit tight = saved;
  tight.rlim_cur = rlim_t(lowest_free);  // no descriptor below the limit is free
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::string outcome;
  try {
    reader.read_full("model.w");
  } catch (const CheckpointIOError& e) {
    outcome = "io: " + e.message();
  } catch (const CorruptCheckpoint& e) {
    outcome = "corrupt: " + e.message();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_NE(outcome.find("io: "), std::string::npos) << outcome;
  EXPECT_NE(outcome.find("Too many open files (4 tries)"), std::string::npos) << outcome;
  EXPECT_EQ(reader.read_full("model.w").at({3, 4}), 19 + 5);
  fs::remove_all(root);
}

// Rank 0 judges what every rank's load came to: a file that no rank sees is damage; one that some
// rank sees but another did not (a stale cache there), or any other I/O error, fails the run and
// leaves the checkpoint in place; another error fails it naming the rank.
TEST(Checkpoint, LoadVerdictsTellDamageFromIOErrors) {
  using train::LoadVerdict;
  const fs::path root = fresh_dir("verdict");
  const fs::path dir = save_checkpoint(root, request(5));
  const fs::path present = dir / "shard-00000.safetensors", lost = dir / "shard-00001.safetensors";
  // As every rank's look says: here, the files that exist.
  const auto seen = [](const fs::path& file) { return fs::exists(file); };
  EXPECT_EQ(train::judge_load(dir, {"", ""}, seen).kind, LoadVerdict::Kind::loaded);
  const LoadVerdict corrupt = train::judge_load(dir, {"", "Cchecksum mismatch"}, seen);
  EXPECT_EQ(corrupt.kind, LoadVerdict::Kind::damaged);
  EXPECT_NE(corrupt.report.find("rank 1: checksum mismatch"), std::string::npos) << corrupt.report;
  EXPECT_EQ(train::judge_load(dir, {"M" + lost.string() + "\nmissing", ""}, seen).kind, LoadVerdict::Kind::damaged);
  const LoadVerdict hidden = train::judge_load(dir, {"", "M" + present.string() + "\nmissing"}, seen);
  EXPECT_EQ(hidden.kind, LoadVerdict::Kind::failed);
  EXPECT_NE(hidden.report.find("left in place"), std::string::npos) << hidden.report;
  EXPECT_NE(hidden.report.find("stale cache"), std::string::npos) << hidden.report;
  EXPECT_EQ(train::judge_load(dir, {"IInput/output error", "Cchecksum mismatch"}, seen).kind, LoadVerdict::Kind::failed);
  const LoadVerdict other = train::judge_load(dir, {"", "Eshapes differ"}, seen);
  EXPECT_EQ(other.kind, LoadVerdict::Kind::failed);
  EXPECT_NE(other.report.find("failed on rank 1: shapes differ"), std::string::npos) << other.report;
  // What each kind of failure is, as a rank reports it.
  EXPECT_EQ(train::load_outcome([] {}), "");
  EXPECT_EQ(train::load_outcome([&] { CheckpointReader{dir / "nothing"}; })[0], 'E');
  EXPECT_EQ(train::load_outcome([&] { throw CorruptCheckpoint("bad", "", __FILE__, __LINE__); }), "Cbad");
  EXPECT_EQ(train::load_outcome([&] { throw CheckpointIOError("gone", "", __FILE__, __LINE__, lost); }),
            "M" + lost.string() + "\ngone");
  EXPECT_EQ(train::load_outcome([&] { throw IOError("EIO", "", __FILE__, __LINE__); }), "IEIO");
  fs::remove_all(root);
}

// A weights-only export (the final save of last_save_model_only) is no place to resume from: the
// newest full checkpoint before it is, and the exports newer than it are named.
TEST(Checkpoint, ResumeSkipsWeightsOnlyExports) {
  const fs::path root = fresh_dir("weights_only");
  for (int64_t s : {2, 4}) save_checkpoint(root, request(s));
  SaveRequest export_request = request(6);
  export_request.train_state = nlohmann::json::object();
  save_checkpoint(root, export_request);
  std::vector<fs::path> skipped;
  const auto full = train::newest_full_checkpoint(root, std::numeric_limits<int64_t>::max(), &skipped);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->filename(), "step-4");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].filename(), "step-6");
  EXPECT_TRUE(train::is_weights_only(root / "step-6"));
  EXPECT_EQ(train::newest_full_checkpoint(root, 3)->filename(), "step-2");
  EXPECT_FALSE(train::newest_full_checkpoint(root, 1).has_value());
  fs::remove_all(root);
}

// Saving a step again (after a rollback) replaces its folder, never leaving a moment without one,
// and what failed saves left behind is purged down to the newest few.
TEST(Checkpoint, SavingAStepAgainReplacesItAndAbandonedFoldersArePurged) {
  const fs::path root = fresh_dir("replace");
  save_checkpoint(root, request(5));
  SaveRequest again = request(5);
  again.tensors[0].local.data<float>()[0] = 42;
  save_checkpoint(root, again);
  EXPECT_EQ(load_checkpoint(root / "step-5").tensors.at("model.w").at({0, 0}), 42);
  for (const auto& e : fs::directory_iterator(root)) EXPECT_EQ(e.path().filename(), "step-5");
  for (int s : {1, 7, 12}) fs::create_directories(root / ("step-" + std::to_string(s) + ".tmp"));
  for (int s : {3, 9}) fs::create_directories(root / ("step-" + std::to_string(s) + ".corrupt"));
  // A replacement cut short between its two renames left step-8 only as step-8.replaced.
  fs::copy(root / "step-5", root / "step-8.replaced");
  const std::vector<fs::path> removed = purge_abandoned(root, 1);
  EXPECT_EQ(removed.size(), 3u);
  for (const char* kept : {"step-5", "step-8", "step-12.tmp", "step-9.corrupt"}) EXPECT_TRUE(fs::exists(root / kept)) << kept;
  EXPECT_FALSE(fs::exists(root / "step-8.replaced"));
  for (const char* gone : {"step-1.tmp", "step-7.tmp", "step-3.corrupt"}) EXPECT_FALSE(fs::exists(root / gone)) << gone;
  fs::remove_all(root);
}

// A save through a 7-byte staging buffer (smaller than one element: every put crosses buffer
// ends) of in-memory pieces and of streamed ones, whose values come interleaved chunk by chunk
// as a swap file hands them out, is the same checkpoint as a save of the same tensors in memory:
// the same files, bytes and checksums. The staged callback comes after the last value is read.
TEST(Checkpoint, StreamedPiecesThroughATinyStagingBufferSaveBitIdentically) {
  const fs::path root = fresh_dir("streamed");
  Tensor m = Tensor::empty({5, 7}, DType::f32), v = Tensor::empty({5, 7}, DType::f32);
  for (int i = 0; i < 35; ++i) m.data<float>()[i] = 0.5f * float(i) - 3, v.data<float>()[i] = float(i * i) + 0.25f;
  SaveRequest whole = request(3);
  whole.tensors.push_back({"optim.m", m, {}});
  whole.tensors.push_back({"optim.v", v, {}});
  SaveRequest streamed = request(3);
  streamed.tensors.push_back({"optim.m", Tensor(), {}, false, true, Shape({5, 7})});
  streamed.tensors.push_back({"optim.v", Tensor(), {}, false, true, Shape({5, 7})});
  bool read_all = false, staged_after = false;
  streamed.streams.push_back([&](const StreamEmit& emit) {
    for (int64_t begin = 0; begin < 35; begin += 8) {  // chunks of 8 elements, the last short
      const int64_t n = std::min<int64_t>(8, 35 - begin);
      emit(2, begin, m.data<float>() + begin, n);
      emit(3, begin, v.data<float>() + begin, n);
    }
    read_all = true;
  });
  const fs::path a = root / "a", b = root / "b";
  fs::create_directories(a);
  fs::create_directories(b);
  const std::string pa = write_shard(a, whole, 0);
  const std::string pb = write_shard(b, streamed, 0, 7, [&] { staged_after = read_all; });
  EXPECT_TRUE(staged_after);
  EXPECT_EQ(pa, pb);
  const auto bytes = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a / "shard-00000.safetensors"), bytes(b / "shard-00000.safetensors"));
  // A stream that skips elements is refused, naming the tensor.
  SaveRequest gap = streamed;
  gap.streams = {[&](const StreamEmit& emit) {
    emit(2, 0, m.data<float>(), 35);
    emit(3, 1, v.data<float>(), 34);
  }};
  try {
    write_shard(root, gap, 0, 7);
    FAIL() << "a stream out of order was written";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'optim.v' streamed out of order"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// A write that fails when the file is flushed (a full disk) fails the commit: here train_state.json
// is a link to /dev/full, whose writes all fail.
TEST(Checkpoint, AWriteThatFailsOnFlushFailsTheCommit) {
  const fs::path root = fresh_dir("full");
  const SaveRequest r = request(5);
  const fs::path tmp = staging_folder(root, 5);
  make_staging_folder(tmp);
  const std::string pieces = write_shard(tmp, r, 0);
  fs::create_symlink("/dev/full", tmp / "train_state.json");
  try {
    commit_checkpoint(root, r, {pieces}, 1);
    FAIL() << "the failed write was not noticed";
  } catch (const IOError& e) {
    EXPECT_NE(e.message().find("cannot write " + (tmp / "train_state.json").string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root / "step-5"));
  fs::remove_all(root);
}

// A safetensors header longer than the reference implementation's 100 MB cap is refused before it
// is parsed (a sparse file of 101 MB whose header claims all of it).
TEST(Safetensors, HeaderOver100MBIsRefused) {
  const fs::path root = fresh_dir("header");
  const fs::path file = root / "big.safetensors";
  const uint64_t claimed = 101'000'000;
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(&claimed), 8);
  fs::resize_file(file, 8 + claimed);
  try {
    SafetensorsFile::open(file);
    FAIL() << "a 101 MB header was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("header length 101000000 exceeds the 100 MB"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}
