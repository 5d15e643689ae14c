// Expert parallelism against one rank: the row exchange on awkward counts (empty blocks, a rank
// that routes nothing), a MoE layer with its routed experts divided over the ranks against the
// whole layer (outputs, every gradient, and the all-to-all bytes against the rows that must
// cross), 20 training steps of each EP layout against the 1-rank run (deepseek_v32, both DSA
// stages; with FSDP, HSDP, TP and CP; deepseek_v4, hash and learned routing), checkpoints resharding between EP and one rank, and the
// errors of degrees that do not fit.
#include "distributed/common.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/core/cpu_features.h"
#include "titan/distributed/expert_parallel.h"
#include "titan/models/moe/moe.h"

using namespace titan;
using namespace titan::test;
using autograd::Variable;

namespace {

// Rows of member s for global expert e in the exchange test: some blocks empty, member 1 routes
// nothing at all.
int64_t rows_of(int s, int64_t e) { return s == 1 ? 0 : (s * 5 + e * 3) % 4; }

// Row i of (member s, expert e): its three coordinates, then zeros.
void tag_row(float* row, int64_t width, int s, int64_t e, int64_t i) {
  for (int64_t c = 0; c < width; ++c) row[c] = 0;
  row[0] = float(s), row[1] = float(e), row[2] = float(i);
}

TEST(ExpertExchange, DispatchGroupsRowsByLocalExpertAndCombineReturnsThem) {
  const distributed::ProcessGroup& ep = world();
  const int n = ep.size(), me = ep.rank();
  const int64_t experts = 3 * n, local = 3, width = 5;
  std::vector<int64_t> offsets = {0};
  for (int64_t e = 0; e < experts; ++e) offsets.push_back(offsets.back() + rows_of(me, e));
  Tensor rows = Tensor::empty({offsets.back(), width}, DType::f32);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t i = 0; i < rows_of(me, e); ++i) tag_row(rows.data<float>() + (offsets[size_t(e)] + i) * width, width, me, e, i);

  distributed::ExpertExchange ex(offsets, ep);
  const Tensor mine = ex.dispatch(rows);
  // Expected: local expert by local expert, every member's rows for it in member order.
  int64_t at = 0;
  for (int64_t l = 0; l < local; ++l) {
    const int64_t e = me * local + l;
    EXPECT_EQ(ex.local_offsets()[size_t(l)], at) << "local expert " << l;
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < rows_of(s, e); ++i, ++at) {
        std::vector<float> want(static_cast<size_t>(width));
        tag_row(want.data(), width, s, e, i);
        for (int64_t c = 0; c < width; ++c)
          ASSERT_EQ(mine.data<float>()[at * width + c], want[size_t(c)]) << "row " << at << " col " << c;
      }
  }
  ASSERT_EQ(ex.received_rows(), at);
  ASSERT_EQ(mine.shape()[0], at);
  const Tensor back = ex.combine(mine);
  expect_close(rows, back, 0, "combine(dispatch(rows))");
}

// A MoE layer (8 routed experts, top 3, a shared expert) on each rank's own tokens with its
// experts divided over the ranks, against the whole layer on every rank's tokens.
TEST(ExpertParallelMoE, EqualsTheWholeLayerWithTheAnalyticTraffic) {
  flush_denormals(true);
  auto ep_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "ep_moe");
  const distributed::ProcessGroup& ep = *ep_group;
  const int n = ep.size(), me = ep.rank();
  models::moe::MoEArgs a;
  a.dim = 16, a.moe_inter_dim = 12, a.n_routed_experts = 8, a.n_shared_experts = 1, a.n_activated_experts = 3;
  a.route_norm = true;
  models::moe::MoE whole(a, 0.02);
  whole.init_parameters(5);
  a.ep = &ep;
  models::moe::MoE split(a, 0.02);
  split.init_parameters(5);
  ASSERT_EQ(split.experts.w1.var.shape()[0], 8 / n);

  const int64_t t = 37;  // tokens per rank (odd)
  const Tensor x_all = random_normal({1, n * t, a.dim}, 9, "x"), dy_all = random_normal({1, n * t, a.dim}, 10, "dy");
  Variable xw(x_all, true);
  Variable yw = whole.forward(xw);
  autograd::backward(yw, dy_all);

  const auto my_rows = [&](const Tensor& all) { return all.slice(1, me * t, (me + 1) * t).contiguous(); };
  distributed::CommEngine::get().reset_stats();
  Variable xs(my_rows(x_all), true);
  Variable ys = split.forward(xs);
  autograd::backward(ys, my_rows(dy_all));
  const auto stats = distributed::CommEngine::get().stats();

  expect_close(my_rows(yw.value()), ys.value(), 1e-6, "y");
  expect_close(my_rows(xw.grad()), xs.grad(), 1e-5, "dx");
  const int64_t el = 8 / n;
  const auto whole_params = whole.named_parameters(), split_params = split.named_parameters();
  ASSERT_EQ(whole_params.size(), split_params.size());
  for (size_t i = 0; i < whole_params.size(); ++i) {
    const std::string& name = whole_params[i].first;
    Tensor want = whole_params[i].second->var.grad();
    Tensor got = split_params[i].second->var.grad().contiguous();
    if (split_params[i].second->expert_sharded) {
      want = want.slice(0, me * el, (me + 1) * el).contiguous();
    } else {  // the router and the shared expert saw this rank's tokens only
      ep.all_reduce(got).wait();
    }
    expect_close(want, got, 1e-5, "gradient of " + name);
  }

  // Traffic: each (token, choice) whose expert lives on another rank crosses once to it and once
  // back, forward and backward alike; the counts cross once, forward.
  Tensor counts = split.tokens_per_expert.contiguous();  // this rank's choices per global expert
  Tensor all_counts = Tensor::empty({n * a.n_routed_experts}, DType::f32);
  ep.all_gather(all_counts, counts).wait();
  double leaving = 0, arriving = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < a.n_routed_experts; ++e) {
      const double c = all_counts.data<float>()[s * a.n_routed_experts + e];
      const int owner = int(e / el);
      if (s == me && owner != me) leaving += c;
      if (s != me && owner == me) arriving += c;
    }
  const double row_bytes = double(a.dim) * 4;
  const std::map<distributed::CommOp, double> want_bytes = {
      {distributed::CommOp::all_to_allv, 2 * (leaving + arriving) * row_bytes},
      {distributed::CommOp::all_to_all, double(a.n_routed_experts) * 8 * (n - 1) / n}};
  expect_analytic_traffic(stats, "ep_moe", want_bytes);
}

TEST(ExpertParallelMoE, DegreesThatDoNotDivideTheExpertsAreRefused) {
  models::moe::MoEArgs a;
  a.dim = 8, a.moe_inter_dim = 4, a.n_routed_experts = 3 * world().size() + 1, a.n_activated_experts = 2;
  a.ep = &world();
  if (world().size() == 1) GTEST_SKIP() << "one rank divides everything";
  const std::string error = error_of([&] { models::moe::MoE m(a, 0.02); });
  EXPECT_NE(error.find("expert_parallel_degree = " + std::to_string(world().size()) + " does not divide the " +
                       std::to_string(a.n_routed_experts) + " routed experts"),
            std::string::npos)
      << error;
}

// Training: every EP layout of this world size against one rank, 20 steps, f32, lr 3e-4 (as the
// TP and CP layouts: MoE routing amplifies the last-bit differences of another summation order,
// here the experts' weight gradients summed over all the group's rows in one GEMM).
class EpLayouts : public TrainingSuite<EpLayouts, 260> {
 public:
  static constexpr const char* kTag = "ep_layouts";

 protected:
  struct Layout {
    std::string name;
    Degrees d = {};
    std::vector<std::string> extra = {};  // more keys, as command-line overrides
  };
  static train::JobConfig config(const std::string& model, const Layout& l, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), "--optimizer.lr=3e-4");
    if (model == "deepseek_v32") extra.insert(extra.begin(), "--model.converters=dsa_fused");
    extra.insert(extra.end(), l.extra.begin(), l.extra.end());
    return layout_config(model, data(), root() / (model + "_" + l.name), l.d, extra);
  }
  static std::string describe(const Layout& l) {
    std::string out;
    for (const auto& [what, d] : {std::pair<const char*, int64_t>{"HSDP replicas", l.d.replicate}, {"FSDP", l.d.shard},
                                  {"CP", l.d.cp}, {"TP", l.d.tp}, {"EP", l.d.ep}})
      if (d > 1) out += (out.empty() ? "" : " x ") + std::string(what) + " " + std::to_string(d);
    return out;
  }
};

// deepseek_v32 through its dense warm-up (3 steps) and sparse stage: EP over all ranks, EP
// 2 with the experts FSDP-sharded over 2, HSDP, TP inside EP (the MoE TP fix), and TorchTitan's
// expert-tensor parallelism (the gather scheme: each expert's hidden units over TP, EP over the
// FSDP ranks); under activation checkpointing the recomputed forward exchanges the rows again.
TEST_F(EpLayouts, DeepSeekV32ReproducesOneRank) {
  const int n = world().size();
  const auto one = reference_on_rank0(config("deepseek_v32", {"reference"}));
  std::vector<Layout> layouts = {{"ep2_ac", {.shard = 2, .ep = 2}, {"--activation_checkpoint.mode=selective"}}};
  if (n == 4)
    layouts = {{"ep4", {.shard = 4, .ep = 4}},
               {"fsdp4_ep2_ac", {.shard = 4, .ep = 2}, {"--activation_checkpoint.mode=full"}},
               {"hsdp_ep2", {.replicate = 2, .shard = 2, .ep = 2}},
               {"fsdp2_tp2_ep4", {.shard = 2, .tp = 2, .ep = 4}},
               {"fsdp2_tp2_ep2_gather", {.shard = 2, .tp = 2, .ep = 2}, {"--parallelism.moe_tp_scheme=gather"}}};
  for (const Layout& l : layouts)
    expect_same_losses(one, train_on(config("deepseek_v32", l), world()), 1e-5,
                       "deepseek_v32 " + describe(l) + (l.extra.empty() ? "" : ", " + l.extra[0]));
}

// deepseek_v4, whose debugmodel routes layers 0-1 by its hash table (the choice read from the
// tokens' ids before the exchange) and the rest by the learned router with its balancing bias
// (updated every step from the loads summed over the ranks): EP 2 on 2 ranks; on 4, EP 2 with the
// experts FSDP-sharded over the other 2 (FSDP 4 x EP 2). Tensor + sequence parallel
// (models/deepseek_v4/parallelize.cpp) shares the reference: TP 2 under both MoE schemes on 2
// ranks (the fix: each rank hash-routes its own tokens by their ids; gather: all tokens, each
// expert's hidden units split), and on 4 TP 2 inside EP 4 with FSDP 2. On 2 ranks also EP 2 and
// TP 2 with an MTP module, against the 1-rank run with it.
TEST_F(EpLayouts, DeepSeekV4ReproducesOneRank) {
  const int n = world().size();
  const auto one = reference_on_rank0(config("deepseek_v4", {"reference"}));
  const std::vector<Layout> layouts =
      n == 4 ? std::vector<Layout>{{"fsdp4_ep2", {.shard = 4, .ep = 2}}, {"fsdp2_tp2_ep4", {.shard = 2, .tp = 2, .ep = 4}}}
             : std::vector<Layout>{{"ep2", {.shard = 2, .ep = 2}},
                                   {"tp2", {.tp = 2}},
                                   {"tp2_gather", {.tp = 2}, {"--parallelism.moe_tp_scheme=gather"}}};
  for (const Layout& l : layouts) {
    const train::JobConfig cfg = config("deepseek_v4", l);
    expect_same_losses(one, train_on(cfg, world()), 1e-5,
                       "deepseek_v4 " + describe(l) + (l.extra.empty() ? "" : ", " + l.extra[0]));
    // The expert loads are logged as DeepSeek-V3's: rank 0's, the worst layer's and a hash layer's.
    for (const std::string key : {"moe_imbalance_max", "moe_imbalance/layer0"})
      EXPECT_EQ(losses_of(cfg.job.dump_folder, "train", key).size(), 20u) << l.name << ": " << key;
  }
  if (n != 2) return;
  // With an MTP module (its learned MoE divided as the main layers', its block tensor parallel):
  // EP 2 and TP 2 against the 1-rank run with it.
  const std::vector<std::string> mtp = {"--model.mtp_layers=1"};
  const auto one_mtp = reference_on_rank0(config("deepseek_v4", {"reference_mtp"}, mtp));
  for (const Layout& l : std::vector<Layout>{{"ep2_mtp", {.shard = 2, .ep = 2}, mtp}, {"tp2_mtp", {.tp = 2}, mtp}}) {
    const train::JobConfig cfg = config("deepseek_v4", l);
    expect_same_losses(one_mtp, train_on(cfg, world()), 1e-5, "deepseek_v4 with MTP, " + describe(l));
    EXPECT_EQ(losses_of(cfg.job.dump_folder, "train", "mtp_loss").size(), 20u) << l.name;
  }
}

// EP borrowing context-parallel ranks: the deepseek_v32 sparse stage from step 1 (CP runs DSA
// only), CP 2 x EP 2, and on 4 ranks CP 2 x TP 2 x EP 4 (every rank its own experts).
TEST_F(EpLayouts, DeepSeekV32UnderContextParallelReproducesOneRank) {
  const int n = world().size();
  const std::vector<std::string> sparse = {"--dsa.warmup_steps=0"};
  const auto one = reference_on_rank0(config("deepseek_v32", {"sparse_reference"}, sparse));
  const Layout l = n == 4 ? Layout{"cp2_tp2_ep4", {.cp = 2, .tp = 2, .ep = 4}}
                           : Layout{"cp2_ep2", {.cp = 2, .ep = 2}};
  expect_same_losses_through_flips(one, train_on(config("deepseek_v32", l, sparse), world()), 1e-3,
                                   "deepseek_v32 " + describe(l));
}

// A checkpoint saved under EP (each rank's experts, FSDP-sharded over the rest; on 4 ranks under
// TorchTitan's expert-tensor parallelism, each rank's experts' half of the hidden units: a slice
// in two dimensions) resumes on one rank, which continues the EP run's losses; the saved experts
// are whole [E, ...] tensors.
TEST_F(EpLayouts, CheckpointsReshardBetweenEpAndOneRank) {
  const int n = world().size();
  const std::vector<std::string> save = {"--checkpoint.enable=true", "--checkpoint.interval=10",
                                         "--checkpoint.keep_latest_k=0", "--checkpoint.last_save_model_only=false"};
  const Layout ep = n == 4 ? Layout{"ckpt_ep", {.shard = 2, .tp = 2, .ep = 2}, {"--parallelism.moe_tp_scheme=gather"}}
                           : Layout{"ckpt_ep", {.shard = 2, .ep = 2}};
  const auto straight = train_on(config("deepseek_v32", ep, save), world());
  ASSERT_EQ(straight.size(), 20u);
  if (world().rank() == 0) {
    const fs::path to = root() / "deepseek_v32_ckpt_one" / "checkpoint";
    fs::create_directories(to);
    fs::copy(root() / "deepseek_v32_ckpt_ep" / "checkpoint" / "step-10", to / "step-10", fs::copy_options::recursive);
    const auto ckpt = checkpoint::load_checkpoint(to / "step-10");
    EXPECT_EQ(ckpt.tensors.at("model.layers.1.moe.experts.w1").shape(), Shape({8, 256, 256}));  // [E, moe_inter_dim, dim]
    EXPECT_EQ(ckpt.tensors.at("model.layers.1.moe.experts.w2").shape(), Shape({8, 256, 256}));
  }
  world().barrier().wait();
  const auto one = reference_on_rank0(config("deepseek_v32", {"ckpt_one"}, save));
  expect_same_losses(std::vector<double>(straight.begin() + 10, straight.end()), one, 1e-5, "EP checkpoint -> 1 rank");
}

TEST_F(EpLayouts, DegreesThatDoNotFitAreRefused) {
  const int n = world().size();
  const auto refused = [&](const train::JobConfig& cfg, const std::string& needle) {
    const std::string error = error_of([&] { train::Trainer t(cfg, "bad_ep.toml", &world()); });
    EXPECT_NE(error.find(needle), std::string::npos) << error;
  };
  refused(config("deepseek_v3", {"bad_degree", {.shard = n, .ep = n + 1}}),
          "parallelism.expert_parallel_degree = " + std::to_string(n + 1) + " cannot borrow its ranks");
  models::ModelOptions dense;  // a model without experts refuses EP rather than ignoring it
  dense.ep = &world();
  const std::string llama3 = error_of([&] { models::build_model("llama3", "debugmodel", 260, 64, dense); });
  EXPECT_NE(llama3.find("llama3 has no experts to divide"), std::string::npos) << llama3;
  // TorchTitan's scheme splits the experts over TP: EP cannot borrow the TP ranks.
  std::vector<std::string> gather = {"--parallelism.moe_tp_scheme=gather"};
  refused(config("deepseek_v3", {"bad_scheme", {.tp = n, .ep = n}}, gather),
          "expert_parallel_degree = " + std::to_string(n) + " cannot borrow its ranks from data_parallel_shard_degree x "
          "context_parallel_degree = 1 x 1 = 1 (under moe_tp_scheme = \"gather\"");
}

}  // namespace
