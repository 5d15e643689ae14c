// Sharded checkpoints reshard on load: a run on every rank (FSDP over 2 or 4) saves at step 10;
// resumed on fewer ranks (FSDP 2, 1 rank) and on DDP, each continues the uninterrupted run's
// losses; the data position carries over, so no sample is repeated or skipped (the losses would
// move). And the checkpoint errors a user can meet: a rank's file missing, metadata that does
// not match the model, degrees that do not multiply to the world, a global batch the ranks
// cannot split.
#include <algorithm>
#include <cstring>

#include "distributed/common.h"
#include "titan/checkpoint/checkpoint.h"

using namespace titan;
using namespace titan::test;

namespace {

train::JobConfig config(const fs::path& data, const fs::path& run, int64_t replicate, int64_t shard, int64_t local) {
  std::string toml = base_toml("llama3", data, run, 20);
  toml += "[checkpoint]\nenable = true\ninterval = 10\nkeep_latest_k = 0\nlast_save_model_only = false\n";
  toml += "[parallelism]\ndata_parallel_replicate_degree = " + std::to_string(replicate) +
          "\ndata_parallel_shard_degree = " + std::to_string(shard) + "\n";
  train::JobConfig c = train::parse_config(toml, "reshard.toml");
  c.training.local_batch_size = local;
  c.training.global_batch_size = 4;
  return c;
}

// Copies step-10 of `from` into a fresh run folder: the resumed run starts there.
void seed_run(const fs::path& from, const fs::path& run) {
  fs::remove_all(run);
  fs::create_directories(run / "checkpoint");
  fs::copy(from / "checkpoint" / "step-10", run / "checkpoint" / "step-10", fs::copy_options::recursive);
}

std::vector<double> tail(const std::vector<double>& losses, size_t from) {
  return std::vector<double>(losses.begin() + long(std::min(from, losses.size())), losses.end());
}

}  // namespace

TEST(Reshard, SavedOnAllRanksResumesOnFewerAndOnDdp) {
  const int n = world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "2 or 4 ranks";
  const fs::path root = shared_folder("reshard"), data = shared_dataset(root);
  // The uninterrupted run: FSDP over every rank, micro-batches of one sequence (accumulated to the
  // global batch of 4), checkpoints at steps 10 and 20.
  const auto straight = train_on(config(data, root / "straight", 1, n, 1), world());
  ASSERT_EQ(straight.size(), 20u);
  const fs::path saved = root / "straight" / "checkpoint" / "step-10";
  EXPECT_EQ(checkpoint::CheckpointReader(saved).world_size(), n);

  // On one rank, accumulating 4 micro-batches of 1: the same tree of sums, so the same bits.
  if (world().rank() == 0) seed_run(root / "straight", root / "one");
  world().barrier().wait();
  const auto one = reference_on_rank0(config(data, root / "one", 1, 1, 1));
  expect_same_losses(tail(straight, 10), one, 0, "FSDP " + std::to_string(n) + " -> 1 rank");
  // The sharded step-20 checkpoint, assembled whole (as titan generate and ckpt convert read it),
  // holds the weights the resumed 1-rank run ended with, to the last bit.
  if (world().rank() == 0) {
    const auto sharded = checkpoint::load_checkpoint(root / "straight" / "checkpoint" / "step-20");
    const auto whole = checkpoint::load_checkpoint(root / "one" / "checkpoint" / "step-20");
    int compared = 0;
    for (const auto& [name, t] : whole.tensors) {
      if (!name.starts_with("model.")) continue;
      ASSERT_TRUE(sharded.tensors.count(name)) << name;
      const Tensor& a = sharded.tensors.at(name);
      ASSERT_EQ(a.shape(), t.shape()) << name;
      EXPECT_EQ(std::memcmp(a.data_ptr(), t.data_ptr(), t.nbytes()), 0) << name;
      ++compared;
    }
    EXPECT_GT(compared, 10);
  }

  // On half the ranks: FSDP (the lower half) and DDP (the upper half, or all ranks when there are 2).
  const int half = n / 2;
  auto halves = distributed::CommEngine::get().split(world(), world().rank() < half ? 0 : 1, world().rank(), "half");
  if (world().rank() == 0) {
    seed_run(root / "straight", root / "fsdp_half");
    seed_run(root / "straight", root / "ddp");
  }
  world().barrier().wait();
  if (n == 4) {
    const bool lower = world().rank() < half;
    const auto got = lower ? train_on(config(data, root / "fsdp_half", 1, half, 1), *halves)
                           : train_on(config(data, root / "ddp", half, 1, 2), *halves);
    world().barrier().wait();
    // FSDP 2 with 2 micro-batches of 1: the tree again, exactly.
    expect_same_losses(tail(straight, 10), losses_of(root / "fsdp_half"), 0, "FSDP 4 -> FSDP 2");
    // DDP 2 with 2-sequence micro-batches computes other GEMM shapes: 1e-5.
    expect_same_losses(tail(straight, 10), losses_of(root / "ddp"), 1e-5, "FSDP 4 -> DDP 2");
    EXPECT_FALSE(got.empty());
  } else {
    expect_same_losses(tail(straight, 10), train_on(config(data, root / "ddp", 2, 1, 2), world()), 1e-5,
                       "FSDP 2 -> DDP 2");
  }

  // Errors, on rank 0 alone (the others have nothing to do and wait).
  if (world().rank() == 0) {
    const distributed::ProcessGroup& one_rank = solo();
    // A rank's file lost (no rank sees it: damage, set aside): named, before training starts.
    const fs::path broken = root / "broken";
    seed_run(root / "straight", broken);
    fs::remove(broken / "checkpoint" / "step-10" / "shard-00001.safetensors");
    const std::string missing = error_of([&] { train::Trainer t(config(data, broken, 1, 1, 1), "broken.toml", &one_rank); });
    EXPECT_NE(missing.find("shard-00001.safetensors: No such file or directory"), std::string::npos) << missing;
    // Metadata that does not match the model: a tensor of another shape (its pieces tile it: the
    // saved pieces twice over).
    const fs::path other = root / "other_shape";
    seed_run(root / "straight", other);
    const fs::path meta = other / "checkpoint" / "step-10" / "metadata.json";
    nlohmann::json m = nlohmann::json::parse(std::ifstream(meta));
    nlohmann::json& norm = m["tensors"]["model.norm.weight"];
    norm["shape"] = {512};
    for (nlohmann::json piece : nlohmann::json(norm["shards"])) {
      piece["offsets"][0] = piece["offsets"][0].get<int64_t>() + 256;
      norm["shards"].push_back(piece);
    }
    std::ofstream(meta) << m.dump();
    const std::string shape = error_of([&] { train::Trainer t(config(data, other, 1, 1, 1), "other.toml", &one_rank); });
    EXPECT_NE(shape.find("checkpoint tensor 'model.norm.weight' is [512] but the model's is [256]"), std::string::npos)
        << shape;
  }
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(root);
}

TEST(Reshard, DegreesAndBatchesThatDoNotFitAreNamed) {
  const int n = world().size();
  const fs::path root = shared_folder("misfit"), data = shared_dataset(root);
  // Degrees whose product is not the world size: every rank refuses before any collective.
  const std::string product = error_of([&] { train::Trainer t(config(data, root / "a", 1, n + 1, 1), "misfit.toml"); });
  EXPECT_NE(product.find("misfit.toml: the [parallelism] degrees (pipeline_parallel_degree = 1, "
                         "data_parallel_replicate_degree = 1, data_parallel_shard_degree = " +
                         std::to_string(n + 1)),
            std::string::npos)
      << product;
  EXPECT_NE(product.find("multiply to " + std::to_string(n + 1) + " ranks, but the job has " + std::to_string(n)),
            std::string::npos)
      << product;
  EXPECT_NE(product.find("set parallelism.data_parallel_shard_degree = " + std::to_string(n)), std::string::npos) << product;
  // A global batch the data-parallel ranks cannot split into equal micro-batches.
  train::JobConfig c = config(data, root / "b", 1, n, 3);
  c.training.global_batch_size = 4;
  const std::string batch = error_of([&] { train::Trainer t(c, "misfit.toml"); });
  EXPECT_NE(batch.find("training.global_batch_size"), std::string::npos) << batch;
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(root);
}
