#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "common/error_of.h"
#include "titan/core/error.h"
#include "titan/train/metrics.h"
#include "titan/train/tensorboard.h"

using namespace titan;
using namespace titan::train;
using titan::test::error_of;
namespace fs = std::filesystem;

namespace {

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("titan_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string read_all(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& f, const std::string& bytes) { std::ofstream(f, std::ios::binary) << bytes; }


}  // namespace

TEST(TensorBoard, MaskedCrc32cIsTheCastagnoliCrcRotatedAndOffset) {
  // CRC-32C's published check value: "123456789" -> 0xE3069283; the record mask is
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8.
  const std::string s = "123456789";
  const uint32_t crc = 0xE3069283u;
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(masked_crc32c({reinterpret_cast<const unsigned char*>(s.data()), s.size()}), masked);
  EXPECT_NE(masked_crc32c({reinterpret_cast<const unsigned char*>(s.data()), s.size() - 1}), masked);
}

TEST(TensorBoard, ReadsTheFileTensorBoardsOwnWriterMade) {
  // Written by reference/make_tensorboard_fixture.py with TensorBoard's RecordWriter and protos.
  const auto got = read_tensorboard_scalars("tests/fixtures/tensorboard/events.out.tfevents.fixture");
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].tag, "loss");
  EXPECT_EQ(got[0].step, 1);
  EXPECT_EQ(got[0].value, 2.5f);
  EXPECT_EQ(got[0].wall_time, 101.0);
  EXPECT_EQ(got[1].tag, "lr");
  EXPECT_EQ(got[1].value, 0.001f);
  EXPECT_EQ(got[2].step, 2);
  EXPECT_EQ(got[2].value, 2.25f);
  EXPECT_EQ(got[3].tag, "validation/loss");
  EXPECT_EQ(got[3].step, 10);
  EXPECT_EQ(got[3].value, -0.75f);
}

TEST(TensorBoard, WriterFramesRecordsAsTensorBoardsWriterDoes) {
  // The same events written by titan frame and encode as TensorBoard's writer did: only the
  // wall times (and so the CRCs covering them) may differ, and the fixture's were fixed, so the
  // record lengths and the scalar payloads must agree.
  const fs::path dir = fresh_folder("same");
  fs::path file;
  {
    TensorBoardWriter w(dir);
    w.add_scalars(1, {{"loss", 2.5}, {"lr", 0.001}});
    w.add_scalars(2, {{"loss", 2.25}});
    w.add_scalars(10, {{"validation/loss", -0.75}});
    file = w.file();
  }
  EXPECT_EQ(read_all(file).size(), read_all("tests/fixtures/tensorboard/events.out.tfevents.fixture").size());
  const auto ours = read_tensorboard_scalars(file);
  const auto theirs = read_tensorboard_scalars("tests/fixtures/tensorboard/events.out.tfevents.fixture");
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].tag, theirs[i].tag);
    EXPECT_EQ(ours[i].step, theirs[i].step);
    EXPECT_EQ(ours[i].value, theirs[i].value);
    EXPECT_GT(ours[i].wall_time, 1.7e9);  // seconds since the epoch, now
  }
  EXPECT_TRUE(file.filename().string().starts_with("events.out.tfevents.")) << file;
  fs::remove_all(dir);
}

TEST(TensorBoard, DamagedOrTruncatedRecordsAreNamedByOffset) {
  const fs::path dir = fresh_folder("damaged");
  fs::path file;
  {
    TensorBoardWriter w(dir);
    w.add_scalars(1, {{"loss", 2.5}});
    file = w.file();
  }
  const std::string good = read_all(file);
  std::string flipped = good;
  flipped[flipped.size() - 6] ^= 0x40;  // inside the last event's payload
  write_all(file, flipped);
  const std::string crc = error_of([&] { read_tensorboard_scalars(file); });
  EXPECT_NE(crc.find("the event's CRC does not match"), std::string::npos) << crc;
  EXPECT_NE(crc.find(file.string()), std::string::npos) << crc;
  write_all(file, good.substr(0, good.size() - 3));
  const std::string cut = error_of([&] { read_tensorboard_scalars(file); });
  EXPECT_NE(cut.find("runs past the end of the file"), std::string::npos) << cut;
  std::string length = good;
  length[0] ^= 1;
  write_all(file, length);
  const std::string head = error_of([&] { read_tensorboard_scalars(file); });
  EXPECT_NE(head.find("record at byte 0: the length's CRC does not match"), std::string::npos) << head;
  fs::remove_all(dir);
}

TEST(TensorBoard, MetricsLoggerWritesEveryStepScalarAndValidation) {
  const fs::path dir = fresh_folder("logger");
  {
    MetricsOptions o;
    o.jsonl = dir / "metrics.jsonl";
    o.tensorboard = dir / "tb";
    o.console = nullptr;
    MetricsLogger log(o);
    StepMetrics m;
    m.step = 7;
    m.loss = 3.25;
    m.grad_norm = 0.5;
    m.lr = 1e-3;
    m.mfu = 0.25;
    m.memory.peak[int(MemCategory::activations)] = int64_t(1) << 30;
    m.summary = {{"indexer_loss", 0.125}, {"moe_imbalance_max", 1.5}};
    m.detail = {{"moe_imbalance/layer1", 1.25}, {"comm_bytes_local", 0.0}};
    log.log_step(m);
    log.log_validation(7, 2.75, 15.6);
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const auto got = read_tensorboard_scalars(files[0]);
  const auto value = [&](const std::string& tag) {
    for (const TensorBoardScalar& s : got)
      if (s.tag == tag) return std::make_pair(s.step, double(s.value));
    return std::make_pair(int64_t(-1), -1.0);
  };
  EXPECT_EQ(value("loss_metrics/global_avg_loss"), std::make_pair(int64_t(7), 3.25));
  EXPECT_EQ(value("grad_norm"), std::make_pair(int64_t(7), 0.5));
  EXPECT_EQ(value("mfu(%)"), std::make_pair(int64_t(7), 25.0));
  EXPECT_EQ(value("memory/activations(GiB)"), std::make_pair(int64_t(7), 1.0));
  EXPECT_EQ(value("loss_metrics/indexer_loss"), std::make_pair(int64_t(7), 0.125));
  EXPECT_EQ(value("moe_imbalance_max"), std::make_pair(int64_t(7), 1.5));
  EXPECT_EQ(value("moe_imbalance/layer1"), std::make_pair(int64_t(7), 1.25));
  // A zero is a value like any other (proto3 would drop it outside the oneof).
  EXPECT_EQ(value("comm_bytes_local"), std::make_pair(int64_t(7), 0.0));
  EXPECT_EQ(value("throughput_all_ranks(tps)"), std::make_pair(int64_t(7), 0.0));
  EXPECT_EQ(value("validation_metrics/loss"), std::make_pair(int64_t(7), 2.75));
  EXPECT_EQ(float(value("lr").second), 1e-3f);
  fs::remove_all(dir);
}

TEST(TensorBoard, OnlyTheRanksThatLogWriteEvents) {
  JobConfig c;
  c.metrics.enable_tensorboard = true;
  EXPECT_EQ(metrics_options(c, "/run", 0).tensorboard, fs::path("/run/tb"));
  EXPECT_TRUE(metrics_options(c, "/run", 1).tensorboard.empty());
  c.metrics.save_for_all_ranks = true;
  EXPECT_EQ(metrics_options(c, "/run", 3).tensorboard, fs::path("/run/tb/rank_3"));
  c.metrics.enable_tensorboard = false;
  EXPECT_TRUE(metrics_options(c, "/run", 0).tensorboard.empty());
}
