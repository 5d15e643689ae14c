// Muon ([optimizer] name = "Muon") on several ranks reproduces the 1-rank run: FSDP (each matrix
// split by rows orthogonalised by one owner rank, optim/muon.h), DDP, HSDP, tensor parallelism (TP 2;
// TP 2 x FSDP 2 on 4 ranks: each matrix gathered from its TP and FSDP pieces at one owner; llama3
// and DeepSeek-V3.2, whose TP-replicated matrices take FSDP's exchange beside TP's), FSDP
// with the swap optimizer, pipeline parallelism, and DeepSeek-V3.2's routed experts under expert
// parallelism over FSDP (whole experts on every rank: nothing to exchange); an FSDP checkpoint
// resumes on one rank. The owners share the matrices, and the exchange sends the analytic minimum
// of the scheme: over the group, each split matrix's pieces but the owner's, there and back. 10
// steps of the debug models (DeepSeek: 6), global batch 4; to the last bit but under EP and TP
// (1e-5: their partial sums are added in another order; TP over 20 steps).
#include "distributed/common.h"

#include "titan/optim/muon_adamw.h"

using namespace titan;
using namespace titan::test;

namespace {

class MuonLayouts : public TrainingSuite<MuonLayouts, 260> {  // 260: TP 2 divides the vocabulary
 public:
  static constexpr const char* kTag = "muon_layouts";

 protected:
  static train::JobConfig config(const std::string& model, const std::string& name, const Degrees& d,
                                 std::vector<std::string> extra = {}) {
    std::vector<std::string> keys = {"--optimizer.name=Muon", "--training.steps=10"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    return layout_config(model, data(), root() / (model + "_" + name), d, keys);
  }
  // The 1-rank run (each test its own: `name`), the global batch as micro-batches of a rank's
  // share accumulated in order: the same sums as the ranks' (train_layouts_test.cpp says why).
  static std::vector<double> reference(const std::string& model, const std::string& name,
                                       const std::vector<std::string>& extra = {}) {
    train::JobConfig c = config(model, "reference_" + name, {}, extra);
    c.training.local_batch_size = 4 / world().size();
    return reference_on_rank0(c);
  }
  // TP 2 on 2 ranks, TP 2 x FSDP 2 on 4.
  static Degrees tp_layout(int ranks) {
    Degrees d;
    d.tp = 2, d.shard = ranks / 2;
    return d;
  }
};

}  // namespace

TEST_F(MuonLayouts, Llama3DataParallelLayoutsMatchOneRank) {
  const int n = world().size();
  const auto one = reference("llama3", "layouts");
  ASSERT_EQ(one.size(), 10u);
  EXPECT_LT(one.back(), one.front());
  expect_same_losses(one, train_on(config("llama3", "fsdp", {1, n}), world()), 0, "Muon, FSDP " + std::to_string(n));
  expect_same_losses(one, train_on(config("llama3", "ddp", {n, 1}), world()), 0, "Muon, DDP " + std::to_string(n));
  if (n == 4) expect_same_losses(one, train_on(config("llama3", "hsdp", {2, 2}), world()), 0, "Muon, HSDP 2 x 2");
}

// Tensor parallelism over 20 steps: row-parallel GEMMs add their partial sums in another order than
// one rank, so 1e-5 (as AdamW's TP layouts, tensor_parallel_test.cpp).
TEST_F(MuonLayouts, Llama3TensorParallelMatchesOneRank) {
  const int n = world().size();
  const std::vector<std::string> steps = {"--training.steps=20"};
  const auto one = reference("llama3", "tp", steps);
  ASSERT_EQ(one.size(), 20u);
  expect_same_losses(one, train_on(config("llama3", "tp", tp_layout(n), steps), world()), 1e-5,
                     n == 2 ? "Muon, TP 2" : "Muon, TP 2 x FSDP 2");
}

TEST_F(MuonLayouts, SwapOptimizerUnderFsdp) {
  if (world().size() != 2) GTEST_SKIP() << "FSDP 2";
  const std::vector<std::string> swap = {"--optimizer.swap=file", "--optimizer.swap_chunk_mb=1"};
  expect_same_losses(reference("llama3", "swap"), train_on(config("llama3", "fsdp_swap", {1, 2}, swap), world()), 0,
                     "Muon, FSDP 2, swapped state");
}

TEST_F(MuonLayouts, DeepSeekV32ExpertsOverFsdp) {
  if (world().size() != 2) GTEST_SKIP() << "EP 2 over FSDP 2";
  Degrees d;
  d.shard = 2, d.ep = 2;
  const std::vector<std::string> steps = {"--training.steps=6"};  // 3 dense warm-up steps, 3 sparse
  // Expert parallelism's all-to-alls sum the experts' outputs in another order than one rank:
  // 1e-5, as AdamW's EP layouts (expert_parallel_test.cpp).
  expect_same_losses(reference("deepseek_v32", "ep", steps), train_on(config("deepseek_v32", "fsdp_ep", d, steps), world()),
                     1e-5,
                     "Muon, deepseek_v32, EP 2 over FSDP 2");
}

// Pipeline parallelism: each stage's matrices are whole on its rank; the stages step their own
// Muon after the gradient norm over both (micro-batches of one sequence, summed as a tree as one
// rank sums them: pipeline_common.h).
TEST_F(MuonLayouts, PipelineParallel) {
  if (world().size() != 2) GTEST_SKIP() << "PP 2";
  const std::vector<std::string> pp = {"--parallelism.pipeline_parallel_degree=2",
                                       "--parallelism.pipeline_parallel_microbatch_size=1",
                                       "--parallelism.pipeline_parallel_gradient_sum=tree"};
  train::JobConfig one = config("llama3", "reference_pp", {});
  one.training.local_batch_size = 1;
  expect_same_losses(reference_on_rank0(one), train_on(config("llama3", "pp", {}, pp), world()), 0, "Muon, PP 2 (1F1B)");
}

// A checkpoint saved under FSDP (each rank's rows of the momentum buffers, with their slices)
// resumes on one rank, which continues the FSDP run's losses to the last bit.
TEST_F(MuonLayouts, CheckpointsReshardBetweenFsdpAndOneRank) {
  const int n = world().size();
  const std::vector<std::string> save = {"--checkpoint.enable=true", "--checkpoint.interval=5",
                                         "--checkpoint.keep_latest_k=0", "--checkpoint.last_save_model_only=false"};
  const auto straight = train_on(config("llama3", "ckpt_fsdp", {1, n}, save), world());
  ASSERT_EQ(straight.size(), 10u);
  if (world().rank() == 0) {
    const fs::path to = root() / "llama3_ckpt_one" / "checkpoint";
    fs::create_directories(to);
    fs::copy(root() / "llama3_ckpt_fsdp" / "checkpoint" / "step-5", to / "step-5", fs::copy_options::recursive);
  }
  world().barrier().wait();
  train::JobConfig one = config("llama3", "ckpt_one", {}, save);
  one.training.local_batch_size = 4 / n;
  const auto resumed = reference_on_rank0(one);
  expect_same_losses(std::vector<double>(straight.begin() + 5, straight.end()), resumed, 0,
                     "Muon: FSDP " + std::to_string(n) + " checkpoint -> 1 rank");
}

// Owners: every split matrix has one, each rank has some. Traffic: summed over the ranks, 2 (N-1)/N
// of the split matrices' elements per step (the debug model's rows divide evenly over 2 and 4).
TEST_F(MuonLayouts, OwnersShareTheWorkAndTheExchangeIsTheMinimum) {
  const int n = world().size();
  train::Trainer t(config("llama3", "traffic", {1, n}), "test", &world());
  const optim::Muon& muon = dynamic_cast<const optim::MuonAdamW&>(t.optimizer()).muon();
  double split_elems = 0;
  for (const auto& [name, p] : t.model().named_parameters())
    if (optim::muon_param_group(*p) == optim::ParamGroup::muon) split_elems += double(p->var.shape().numel());
  std::vector<double> sums = {double(muon.owned_matrices()), double(muon.exchanged_elements())};
  EXPECT_GT(muon.owned_matrices(), 0) << "rank " << world().rank() << " owns no matrix";
  world().all_reduce(std::span<double>(sums));
  EXPECT_EQ(sums[0], double(muon.split_matrices()));
  EXPECT_EQ(muon.split_matrices(), 42) << "llama3 debug: 6 blocks x 7 matrices, all split by FSDP";
  EXPECT_EQ(sums[1], 2.0 * (n - 1) / n * split_elems);
}

// Under TP (TP 2; TP 2 x FSDP 2 on 4 ranks) every hidden matrix is split over the whole group:
// column-parallel ones by rows, row-parallel ones by columns, FSDP's rows of each TP slice. Every
// one has an owner, and the exchange is again the minimum: 2 (N-1)/N of the split matrices.
TEST_F(MuonLayouts, TensorParallelOwnersAndTheExchangeIsTheMinimum) {
  const int n = world().size();
  train::Trainer t(config("llama3", "traffic_tp", tp_layout(n)), "test", &world());
  const optim::Muon& muon = dynamic_cast<const optim::MuonAdamW&>(t.optimizer()).muon();
  double split_elems = 0;
  for (const auto& [name, p] : t.model().named_parameters())
    if (optim::muon_param_group(*p) == optim::ParamGroup::muon)
      split_elems += double(p->slice.global_shape.empty() ? p->var.shape().numel() : p->slice.global_shape.numel());
  EXPECT_EQ(muon.tp_split_matrices(), 42) << "llama3 debug: 6 blocks x 7 matrices, all tensor-parallel";
  EXPECT_EQ(muon.split_matrices(), muon.tp_split_matrices()) << "no matrix is split by FSDP alone";
  EXPECT_GT(muon.tp_owned_matrices(), 0) << "rank " << world().rank() << " owns no matrix";
  std::vector<double> sums = {double(muon.tp_owned_matrices()), double(muon.tp_exchanged_elements())};
  world().all_reduce(std::span<double>(sums));
  EXPECT_EQ(sums[0], 42.0);
  EXPECT_EQ(sums[1], 2.0 * (n - 1) / n * split_elems);
}

// DeepSeek-V3.2 under TP 2 (TP 2 x FSDP 2 on 4 ranks): its column- and row-parallel matrices go
// to the TP group's exchange, and the matrices every TP rank holds whole (MLA's down-projections,
// the routers, the indexer, the routed experts under the MoE TP fix) stay with FSDP's (whole on a
// rank without it), so on 4 ranks both exchanges run in one step. 6 steps (3 dense warm-up, 3
// sparse) at lr 3e-4, to 1e-5 as AdamW's (tensor_parallel_test.cpp says why the lower lr).
TEST_F(MuonLayouts, DeepSeekV32TensorParallel) {
  const int n = world().size();
  const std::vector<std::string> ds = {"--model.converters=dsa_fused", "--training.steps=6", "--optimizer.lr=3e-4",
                                       "--dsa.warmup_steps=3", "--dsa.topk=16"};
  const auto one = reference("deepseek_v32", "tp", ds);
  train::JobConfig c = config("deepseek_v32", "tp", tp_layout(n), ds);
  if (n == 4) {  // both exchanges: some matrices split by FSDP alone, the rest over dp_shard x tp
    train::Trainer t(c, "test", &world());
    const optim::Muon& muon = dynamic_cast<const optim::MuonAdamW&>(t.optimizer()).muon();
    EXPECT_GT(muon.tp_split_matrices(), 0);
    EXPECT_GT(muon.split_matrices(), muon.tp_split_matrices());
  }
  expect_same_losses(one, train_on(c, world()), 1e-5,
                     n == 2 ? "Muon, deepseek_v32, TP 2" : "Muon, deepseek_v32, TP 2 x FSDP 2");
}
