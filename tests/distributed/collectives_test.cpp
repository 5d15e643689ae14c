// Every collective against a serial reference: odd sizes, f32 and bf16, the world and sub-groups.
// Each rank fills its input from (rank, index), so every rank can compute what every other sent.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "titan/distributed/comm_engine.h"
#include "titan/distributed/device_mesh.h"
#include "common/error_of.h"

using namespace titan;
using namespace titan::distributed;

namespace {

const ProcessGroup& world() { return CommEngine::get().world(); }

// A value no two (rank, index) pairs share, exactly representable in bf16 (8 significant bits)
// so that bf16 and f32 references agree: small integers and halves.
double value_of(int rank, int64_t i) { return double((rank * 37 + i * 11) % 97) * 0.5 - 20; }

Tensor filled(int64_t n, DType dt, int rank, int64_t offset = 0) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = float(value_of(rank, offset + i));
  return dt == DType::f32 ? t : t.to(dt);
}

double at(const Tensor& t, int64_t i) { return t.dtype() == DType::f32 ? t.data<float>()[i] : bf16_to_f32(t.data<bf16>()[i]); }

// Sub-groups of the world: even and odd ranks (on 1 rank, the world alone).
std::unique_ptr<ProcessGroup> parity_group() {
  const ProcessGroup& w = world();
  return CommEngine::get().split(w, w.rank() % 2, w.rank(), "parity");
}

// The members' values summed as the reductions do: a binary tree over group ranks.
float tree_sum(std::vector<float> v) {
  for (size_t stride = 1; stride < v.size(); stride *= 2)
    for (size_t r = 0; r + stride < v.size(); r += 2 * stride) v[r] += v[r + stride];
  return v.empty() ? 0.0f : v[0];
}

void check_all_reduce(const ProcessGroup& g, int64_t n, DType dt) {
  Tensor t = filled(n, dt, g.world_ranks()[size_t(g.rank())]);
  g.all_reduce(t).wait();
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r : g.world_ranks()) want += value_of(r, i);
    // The tree sum of the rounded values, rounded once more for bf16.
    std::vector<float> vals;
    for (int r : g.world_ranks()) vals.push_back(float(value_of(r, i)));
    const float acc = tree_sum(vals);
    const double expect = dt == DType::f32 ? double(acc) : double(bf16_to_f32(f32_to_bf16(acc)));
    ASSERT_EQ(at(t, i), expect) << g.name() << " n=" << n << " i=" << i << " (exact sum " << want << ")";
  }
  Tensor mx = filled(n, dt, g.world_ranks()[size_t(g.rank())]);
  g.all_reduce(mx, ReduceOp::max).wait();
  for (int64_t i = 0; i < n; ++i) {
    double want = -1e30;
    for (int r : g.world_ranks()) want = std::max(want, value_of(r, i));
    ASSERT_EQ(at(mx, i), want) << "max " << g.name() << " n=" << n << " i=" << i;
  }
}

void check_gather_scatter(const ProcessGroup& g, int64_t n, DType dt) {
  const int me = g.world_ranks()[size_t(g.rank())], size = g.size();
  // all_gather: member j's n values at [j*n, (j+1)*n).
  Tensor in = filled(n, dt, me), out = Tensor::empty({size * n}, dt);
  g.all_gather(out, in).wait();
  for (int j = 0; j < size; ++j) {
    const Tensor theirs = filled(n, dt, g.world_ranks()[size_t(j)]);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(out, j * n + i), at(theirs, i));
  }
  // reduce_scatter: chunk rank() of every member's [size * n], summed in rank order.
  Tensor big = filled(size * n, dt, me), mine = Tensor::empty({n}, dt);
  g.reduce_scatter(mine, big).wait();
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> vals;
    for (int r : g.world_ranks()) vals.push_back(float(value_of(r, g.rank() * n + i)));
    const float acc = tree_sum(vals);
    const double expect = dt == DType::f32 ? double(acc) : double(bf16_to_f32(f32_to_bf16(acc)));
    ASSERT_EQ(at(mine, i), expect) << "reduce_scatter " << g.name() << " n=" << n << " i=" << i;
  }
  // all_to_all: chunk j of my input to member j.
  Tensor a2a = Tensor::empty({size * n}, dt);
  g.all_to_all(a2a, big).wait();
  for (int j = 0; j < size; ++j)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(a2a, j * n + i), value_of(g.world_ranks()[size_t(j)], g.rank() * n + i));
  // broadcast from the last member.
  Tensor b = filled(n, dt, me);
  g.broadcast(b, size - 1).wait();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(b, i), value_of(g.world_ranks().back(), i));
}

}  // namespace

// On 4 ranks f32 sums of 1e8, 1, -1e8, 1 tell the orders apart: rank order gives 1, the tree 0.
TEST(Collectives, ReductionsSumAsABinaryTree) {
  const ProcessGroup& g = world();
  const float mine[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  Tensor t = Tensor::full({3}, double(mine[g.rank() % 4]), DType::f32);
  Tensor big = Tensor::full({8192}, double(mine[g.rank() % 4]), DType::f32);  // the two-stage path
  g.all_reduce(t).wait();
  g.all_reduce(big).wait();
  std::vector<float> vals;
  for (int r = 0; r < g.size(); ++r) vals.push_back(mine[r % 4]);
  EXPECT_EQ(t.data<float>()[0], tree_sum(vals));
  EXPECT_EQ(big.data<float>()[8191], tree_sum(vals));
  if (g.size() == 4) {
    EXPECT_EQ(t.data<float>()[0], 0.0f) << "a tree, not rank order (which gives 1)";
  }
}

TEST(Collectives, AllReduceIsTheTreeSum) {
  auto parity = parity_group();
  for (const ProcessGroup* g : {static_cast<const ProcessGroup*>(&world()), static_cast<const ProcessGroup*>(parity.get())})
    for (int64_t n : {1, 3, 1000, 4099, 100003})
      for (DType dt : {DType::f32, DType::bf16}) check_all_reduce(*g, n, dt);
}

TEST(Collectives, GatherScatterAllToAllBroadcast) {
  auto parity = parity_group();
  for (const ProcessGroup* g : {static_cast<const ProcessGroup*>(&world()), static_cast<const ProcessGroup*>(parity.get())})
    for (int64_t n : {1, 7, 1025, 30001})
      for (DType dt : {DType::f32, DType::bf16}) check_gather_scatter(*g, n, dt);
}

TEST(Collectives, AllToAllvSendRecvAndHostValues) {
  const ProcessGroup& g = world();
  const int me = g.rank(), size = g.size();
  // Member j receives (me + j + 1) elements from me.
  std::vector<int64_t> send(static_cast<size_t>(size)), recv(static_cast<size_t>(size));
  for (int j = 0; j < size; ++j) send[size_t(j)] = me + j + 1, recv[size_t(j)] = j + me + 1;
  const int64_t total_send = std::accumulate(send.begin(), send.end(), int64_t(0));
  const int64_t total_recv = std::accumulate(recv.begin(), recv.end(), int64_t(0));
  Tensor in = filled(total_send, DType::f32, me), out = Tensor::empty({total_recv}, DType::f32);
  g.all_to_allv(out, in, send, recv).wait();
  int64_t off = 0;
  for (int j = 0; j < size; ++j) {
    int64_t their_off = 0;  // where member j's elements for me start in its input
    for (int k = 0; k < me; ++k) their_off += j + k + 1;
    for (int64_t i = 0; i < recv[size_t(j)]; ++i) ASSERT_EQ(out.data<float>()[off + i], float(value_of(j, their_off + i)));
    off += recv[size_t(j)];
  }
  if (size > 1) {  // a ring: send to the next, receive from the previous
    Tensor mine = filled(5, DType::bf16, me), theirs = Tensor::empty({5}, DType::bf16);
    Work s = g.send(mine, (me + 1) % size, 3);
    g.recv(theirs, (me + size - 1) % size, 3).wait();
    s.wait();
    for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(at(theirs, i), at(filled(5, DType::bf16, (me + size - 1) % size), i));
  }
  std::vector<double> v = {double(me), 1.0 / 3.0, -double(me)};
  g.all_reduce(v);
  EXPECT_EQ(v[0], double(size * (size - 1) / 2));
  EXPECT_EQ(v[1], [&] { double a = 0; for (int r = 0; r < size; ++r) a += 1.0 / 3.0; return a; }());
  const std::vector<std::string> names = g.all_gather(std::string(size_t(me + 1), char('a' + me)));
  ASSERT_EQ(int(names.size()), size);
  for (int j = 0; j < size; ++j) EXPECT_EQ(names[size_t(j)], std::string(size_t(j + 1), char('a' + j)));
  g.barrier().wait();
}

// Many requests in flight at once complete in any order of waiting, with the same results.
TEST(Collectives, ManyInFlight) {
  const ProcessGroup& g = world();
  std::vector<Tensor> ts;
  std::vector<Work> works;
  for (int k = 0; k < 40; ++k) {
    ts.push_back(filled(997 + k * 131, DType::f32, g.rank(), k));
    works.push_back(g.all_reduce(ts.back()));
  }
  for (int k = 39; k >= 0; --k) works[size_t(k)].wait();
  for (int k = 0; k < 40; ++k) {
    std::vector<float> vals;
    for (int r = 0; r < g.size(); ++r) vals.push_back(float(value_of(r, k + 5)));
    ASSERT_EQ(ts[size_t(k)].data<float>()[5], tree_sum(vals)) << k;
  }
}

TEST(Collectives, CountersMatchTheFormulas) {
  const ProcessGroup& g = world();
  CommEngine::get().reset_stats();
  const int64_t n = 12000;  // divisible by 1..4 ranks
  Tensor t = filled(n, DType::f32, g.rank()), out = Tensor::empty({n * g.size()}, DType::f32);
  g.all_reduce(t).wait();
  g.all_gather(out, t).wait();
  const auto stats = CommEngine::get().stats();
  const int size = g.size();
  if (size == 1) return;  // one rank moves nothing and counts nothing
  const CommStats ar = stats.at({"world", CommOp::all_reduce}), ag = stats.at({"world", CommOp::all_gather});
  EXPECT_EQ(ar.calls, 1);
  EXPECT_EQ(ar.bytes, 2 * (size - 1) * n * 4 / size);  // 2 (N-1)/N x bytes
  EXPECT_EQ(ag.bytes, (size - 1) * n * 4);             // (N-1) x the input
  EXPECT_GT(ag.busy_seconds, 0);
  // One host here (tests/multihost/ checks ranks on two): nothing crossed hosts.
  EXPECT_EQ(CommEngine::get().hosts(), 1);
  EXPECT_EQ(ar.cross_host_bytes, 0);
  EXPECT_EQ(ag.cross_host_bytes, 0);
}

// FSDP 2 x TP 2 (rank = shard * 2 + tp) with EP 2: the MoE TP fix takes the TP pair as its EP
// group (experts FSDP-sharded over the shard pair); TorchTitan's expert-tensor parallelism
// (expert_tp) keeps TP peers apart: EP over the shard pair, each TP rank its own, and nothing
// left for expert FSDP.
TEST(DeviceMesh, ExpertGroupsBorrowTensorParallelRanksOrNot) {
  const ProcessGroup& w = world();
  if (w.size() != 4) GTEST_SKIP() << "the layout test needs 4 ranks";
  const int shard = w.rank() / 2, tp = w.rank() % 2;
  const DeviceMesh fix(w, {1, 1, 2, 1, 2}, 2);
  EXPECT_EQ(fix.ep().world_ranks(), (std::vector<int>{shard * 2, shard * 2 + 1}));
  EXPECT_EQ(fix.efsdp().world_ranks(), (std::vector<int>{tp, tp + 2}));
  const DeviceMesh etp(w, {1, 1, 2, 1, 2}, 2, /*expert_tp=*/true);
  EXPECT_EQ(etp.ep().world_ranks(), (std::vector<int>{tp, tp + 2}));
  EXPECT_EQ(etp.ep().rank(), shard);
  EXPECT_EQ(etp.efsdp().world_ranks(), (std::vector<int>{w.rank()}));
  const std::string error = test::error_of([&] { check_expert_degree({1, 1, 1, 1, 4}, 2, "mesh.toml", true); });
  EXPECT_NE(error.find("mesh.toml: parallelism.expert_parallel_degree = 2 cannot borrow its ranks from "
                       "data_parallel_shard_degree x context_parallel_degree = 1 x 1 = 1"),
            std::string::npos)
      << error;
}

TEST(DeviceMesh, GroupsFollowTheRowMajorLayout) {
  const ProcessGroup& w = world();
  if (w.size() != 4) GTEST_SKIP() << "the layout test needs 4 ranks";
  const DeviceMesh mesh(w, {1, 2, 2, 1, 1});  // HSDP 2 x 2
  // rank = replicate * 2 + shard
  EXPECT_EQ(mesh.coordinate(MeshDim::dp_replicate), w.rank() / 2);
  EXPECT_EQ(mesh.coordinate(MeshDim::dp_shard), w.rank() % 2);
  EXPECT_EQ(mesh.group(MeshDim::dp_shard).world_ranks(), (std::vector<int>{w.rank() / 2 * 2, w.rank() / 2 * 2 + 1}));
  EXPECT_EQ(mesh.group(MeshDim::dp_replicate).world_ranks(), (std::vector<int>{w.rank() % 2, w.rank() % 2 + 2}));
  EXPECT_EQ(mesh.dp().size(), 4);
  EXPECT_EQ(mesh.fsdp().size(), 2);
  EXPECT_EQ(mesh.loss().size(), 4);
  EXPECT_EQ(mesh.dp().rank(), w.rank());
  // A reduction over the shard group then the replicas is the world's sum.
  Tensor t = filled(11, DType::f32, w.rank());
  mesh.group(MeshDim::dp_shard).all_reduce(t).wait();
  mesh.group(MeshDim::dp_replicate).all_reduce(t).wait();
  for (int64_t i = 0; i < 11; ++i) {
    double want = 0;
    for (int r = 0; r < 4; ++r) want += value_of(r, i);
    EXPECT_EQ(t.data<float>()[i], float(want));
  }
}
