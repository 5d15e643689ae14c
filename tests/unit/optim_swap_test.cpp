// The swap optimizer's parts: the chunked layout visits every element once and round-trips
// through the file; AdamW with swapped moments updates parameters bit for bit as in memory
// (tensors of awkward sizes split over chunks, a frozen parameter, bf16 compute copies); its
// state saves and loads across the two modes; only two chunks are resident; a store that fails
// mid-step surfaces its error from the step. Muon's momentum buffers swap the same way: its
// matrices (experts too) cut across chunks update bit for bit as in memory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/rng.h"
#include "titan/optim/adamw.h"
#include "titan/optim/muon.h"
#include "titan/optim/swapped_moments.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("titan_swap_" + std::to_string(::getpid())) / name;
}

// Sizes that cross 4 KiB-page chunks (1024 elements each with chunk_bytes 8 KiB) at odd places.
struct Awkward : nn::Module {
  nn::Variable& a = register_parameter("a", {3, 7}, nn::Init::normal(0, 0.02)).var;
  nn::Variable& b = register_parameter("b", {2500}, nn::Init::normal(0, 0.02), /*weight_decay=*/false).var;
  nn::Variable& c = register_parameter("c", {1}, nn::Init::constant(0.5)).var;
  nn::Variable& d = register_parameter("d", {33, 101}, nn::Init::normal(0, 0.02)).var;
  nn::Variable& frozen = register_parameter("frozen", {1030}, nn::Init::normal(0, 0.02)).var;
};

// Random gradients on every parameter of m (the one named "frozen" only with with_frozen).
template <class Module>
void fill_grads(Module& m, uint64_t seed, bool with_frozen) {
  Generator rng(seed);
  for (auto& [name, p] : m.named_parameters()) {
    if (name == "frozen" && !with_frozen) {
      p->var.clear_grad();
      continue;
    }
    Tensor& g = p->var.ensure_grad();
    for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = rng.next_uniform() - 0.5f;
  }
}

void expect_bitwise_equal(Awkward& x, Awkward& y) {
  const auto px = x.named_parameters(), py = y.named_parameters();
  for (size_t i = 0; i < px.size(); ++i) {
    const Tensor& u = px[i].second->var.value();
    const Tensor& v = py[i].second->var.value();
    ASSERT_EQ(std::memcmp(u.data<float>(), v.data<float>(), size_t(u.numel()) * 4), 0) << px[i].first;
  }
}

optim::Swap small_chunks(const std::string& name) { return {temp(name).string(), 8192}; }

}  // namespace

TEST(SwappedMoments, VisitsEveryElementOnceAndRoundTrips) {
  const std::vector<int64_t> sizes = {21, 2500, 1, 3333, 0, 1030};
  optim::SwappedMoments m(sizes, 8192, std::make_unique<optim::FileSwapStore>(temp("layout").string()));
  EXPECT_GE(m.chunk_count(), 7);
  EXPECT_EQ(m.resident_bytes(), 2 * (8192 + 4096)) << "two chunk buffers and their page alignment";
  // Zeros at first; then every element set to a value naming it, read back in a second pass.
  std::vector<std::vector<int>> seen(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) seen[t].assign(size_t(sizes[t]), 0);
  int last_tensor = -1;
  int64_t next = 0;
  m.for_each(optim::SwappedMoments::Access::update, [&](const optim::SwappedMoments::Piece& p) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.exp_avg) % 64, 0u) << "pieces are as aligned as tensors";
    if (p.tensor != last_tensor) {
      EXPECT_GT(p.tensor, last_tensor);
      last_tensor = p.tensor;
      next = 0;
    }
    EXPECT_EQ(p.begin, next) << "in element order";
    next = p.begin + p.n;
    for (int64_t i = 0; i < p.n; ++i) {
      EXPECT_EQ(p.exp_avg[i], 0.0f);
      EXPECT_EQ(p.exp_avg_sq[i], 0.0f);
      ++seen[size_t(p.tensor)][size_t(p.begin + i)];
      p.exp_avg[i] = float(p.tensor * 10000 + p.begin + i);
      p.exp_avg_sq[i] = -float(p.tensor * 10000 + p.begin + i);
    }
  });
  for (size_t t = 0; t < sizes.size(); ++t)
    for (int64_t i = 0; i < sizes[t]; ++i) ASSERT_EQ(seen[t][size_t(i)], 1) << "tensor " << t << " element " << i;
  int64_t checked = 0;
  m.for_each(optim::SwappedMoments::Access::read, [&](const optim::SwappedMoments::Piece& p) {
    for (int64_t i = 0; i < p.n; ++i) {
      ASSERT_EQ(p.exp_avg[i], float(p.tensor * 10000 + p.begin + i));
      ASSERT_EQ(p.exp_avg_sq[i], -float(p.tensor * 10000 + p.begin + i));
    }
    checked += p.n;
  });
  EXPECT_EQ(checked, 21 + 2500 + 1 + 3333 + 1030);
  EXPECT_TRUE(fs::is_empty(temp(""))) << "the file is unlinked once open";
}

TEST(SwappedMoments, OnlyTwoChunksAreResident) {
  const int64_t before = memory_stats().live[size_t(MemCategory::optimizer_state)];
  {
    optim::SwappedMoments m({1 << 20}, 256 << 10, std::make_unique<optim::FileSwapStore>(temp("resident").string()));
    EXPECT_EQ(m.chunk_count(), 32);
    const int64_t held = memory_stats().live[size_t(MemCategory::optimizer_state)] - before;
    EXPECT_EQ(held, m.resident_bytes());
    EXPECT_EQ(held, 2 * ((256 << 10) + 4096)) << "two chunk buffers and their page alignment";
  }
  EXPECT_EQ(memory_stats().live[size_t(MemCategory::optimizer_state)], before);
}

TEST(SwapAdamW, UpdatesBitForBitAsInMemory) {
  Awkward x, y;
  x.init_parameters(7);
  y.init_parameters(7);
  kernels::AdamWParams cfg{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  optim::AdamW memory(x.named_parameters(), cfg);
  optim::AdamW swapped(nn::trainable_params(y.named_parameters()), cfg, small_chunks("adamw"));
  ASSERT_GE(swapped.swapped()->chunk_count(), 5);
  for (int step = 0; step < 6; ++step) {
    const bool with_frozen = step >= 3;  // trains only from step 4, with its own bias corrections
    fill_grads(x, 100 + uint64_t(step), with_frozen);
    fill_grads(y, 100 + uint64_t(step), with_frozen);
    memory.step(0.01f, step % 2 ? 0.5f : 1.0f);
    swapped.step(0.01f, step % 2 ? 0.5f : 1.0f);
    expect_bitwise_equal(x, y);
  }
  EXPECT_EQ(swapped.param_steps("frozen"), 3);
  // The states are equal too, and a swapped state loads into memory and back.
  const auto sm = memory.state_dict(), ss = swapped.state_dict();
  ASSERT_EQ(sm.size(), ss.size());
  for (size_t i = 0; i < sm.size(); ++i) {
    ASSERT_EQ(sm[i].first, ss[i].first);
    ASSERT_EQ(std::memcmp(sm[i].second.data_ptr(), ss[i].second.data_ptr(), sm[i].second.nbytes()), 0) << sm[i].first;
  }
  std::map<std::string, Tensor> state;
  for (auto& [k, v] : ss) state[k] = v.clone();
  Awkward u, w;
  u.init_parameters(7);
  w.init_parameters(7);
  optim::AdamW into_memory(u.named_parameters(), cfg);
  optim::AdamW into_swap(nn::trainable_params(w.named_parameters()), cfg, small_chunks("adamw_loaded"));
  into_memory.load_state_dict(state, "swapped state");
  into_swap.load_state_dict(state, "swapped state");
  fill_grads(u, 1, true);
  fill_grads(w, 1, true);
  fill_grads(x, 1, true);
  memory.step(0.01f);
  into_memory.step(0.01f);
  into_swap.step(0.01f);
  // u and w started from x's initial weights, so compare their updates by state instead.
  const auto after = memory.state_dict(), after_memory = into_memory.state_dict(), after_swap = into_swap.state_dict();
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(std::memcmp(after[i].second.data_ptr(), after_memory[i].second.data_ptr(), after[i].second.nbytes()), 0);
    ASSERT_EQ(std::memcmp(after[i].second.data_ptr(), after_swap[i].second.data_ptr(), after[i].second.nbytes()), 0);
  }
}

TEST(SwapAdamW, BF16ComputeCopiesAreRefreshed) {
  Awkward x, y;
  x.init_parameters(3);
  y.init_parameters(3);
  for (Awkward* m : {&x, &y}) {
    for (auto& [name, p] : m->named_parameters()) p->gemm_weight = true;
    m->set_compute_dtype(DType::bf16);
  }
  optim::AdamW memory(x.named_parameters(), {});
  optim::AdamW swapped(nn::trainable_params(y.named_parameters()), {}, small_chunks("bf16"));
  fill_grads(x, 5, true);
  fill_grads(y, 5, true);
  memory.step(0.01f);
  swapped.step(0.01f);
  const auto px = nn::trainable_params(x.named_parameters()), py = nn::trainable_params(y.named_parameters());
  for (size_t i = 0; i < px.size(); ++i) {
    ASSERT_TRUE(px[i].compute && px[i].compute->defined());
    ASSERT_EQ(std::memcmp(px[i].compute->data_ptr(), py[i].compute->data_ptr(), px[i].compute->nbytes()), 0);
  }
}

namespace {

// Muon's matrices, cut by 1024-element chunks (chunk_bytes 4 KiB, one array) mid-row and mid-expert.
struct Matrices : nn::Module {
  nn::Parameter& a = register_parameter("a", {3, 7}, nn::Init::normal(0, 0.02));
  nn::Parameter& d = register_parameter("d", {33, 101}, nn::Init::normal(0, 0.02));
  nn::Parameter& experts = register_parameter("experts", {3, 20, 30}, nn::Init::normal(0, 0.02));
  nn::Parameter& frozen = register_parameter("frozen", {40, 9}, nn::Init::normal(0, 0.02), /*weight_decay=*/false);
  nn::Parameter& tall = register_parameter("tall", {70, 5}, nn::Init::normal(0, 0.02));
};

void expect_bitwise_equal(Matrices& x, Matrices& y) {
  const auto px = nn::trainable_params(x.named_parameters()), py = nn::trainable_params(y.named_parameters());
  for (size_t i = 0; i < px.size(); ++i) {
    const Tensor& u = px[i].var.value();
    const Tensor& v = py[i].var.value();
    ASSERT_EQ(std::memcmp(u.data_ptr(), v.data_ptr(), u.nbytes()), 0) << px[i].name;
    if (px[i].compute && px[i].compute->defined()) {
      ASSERT_EQ(std::memcmp(px[i].compute->data_ptr(), py[i].compute->data_ptr(), px[i].compute->nbytes()), 0)
          << px[i].name << "'s bf16 compute copy";
    }
  }
}

}  // namespace

TEST(SwapMuon, UpdatesBitForBitAsInMemory) {
  Matrices x, y;
  x.init_parameters(11);
  y.init_parameters(11);
  for (Matrices* m : {&x, &y}) {
    m->d.gemm_weight = m->experts.gemm_weight = true;  // mixed precision: bf16 copies refreshed by the step
    m->set_compute_dtype(DType::bf16);
  }
  optim::MuonConfig cfg;
  optim::Muon memory(nn::trainable_params(x.named_parameters()), cfg);
  optim::Muon swapped(nn::trainable_params(y.named_parameters()), cfg, optim::Swap{temp("muon").string(), 4096});
  ASSERT_NE(swapped.swapped(), nullptr);
  ASSERT_GE(swapped.swapped()->chunk_count(), 6);
  EXPECT_EQ(swapped.swapped()->stored_bytes(), swapped.swapped()->chunk_count() * 4096)
      << "one f32 array per element: a chunk of 1024 elements is one page";
  for (int step = 0; step < 5; ++step) {
    const bool with_frozen = step >= 2;
    fill_grads(x, 200 + uint64_t(step), with_frozen);
    fill_grads(y, 200 + uint64_t(step), with_frozen);
    memory.step(0.02f, step % 2 ? 0.5f : 1.0f);
    swapped.step(0.02f, step % 2 ? 0.5f : 1.0f);
    expect_bitwise_equal(x, y);
  }
  // The states are equal, and the swapped one loads into another swapped Muon that then steps as
  // the in-memory one does.
  const auto sm = memory.state_dict(), ss = swapped.state_dict();
  ASSERT_EQ(sm.size(), ss.size());
  std::map<std::string, Tensor> state;
  for (size_t i = 0; i < sm.size(); ++i) {
    ASSERT_EQ(sm[i].first, ss[i].first);
    ASSERT_EQ(std::memcmp(sm[i].second.data_ptr(), ss[i].second.data_ptr(), sm[i].second.nbytes()), 0) << sm[i].first;
    state[ss[i].first] = ss[i].second.clone();
  }
  Matrices w;
  std::map<std::string, Tensor> weights;
  for (auto& [k, v] : x.state_dict()) weights[k] = v;
  w.load_state_dict(weights);
  optim::Muon into_swap(nn::trainable_params(w.named_parameters()), cfg, optim::Swap{temp("muon_loaded").string(), 4096});
  into_swap.load_state_dict(state, "swapped state");
  fill_grads(x, 9, true);
  fill_grads(w, 9, true);
  memory.step(0.02f);
  into_swap.step(0.02f);
  const auto px = nn::trainable_params(x.named_parameters()), pw = nn::trainable_params(w.named_parameters());
  for (size_t i = 0; i < px.size(); ++i)
    ASSERT_EQ(std::memcmp(px[i].var.value().data_ptr(), pw[i].var.value().data_ptr(), px[i].var.value().nbytes()), 0)
        << px[i].name;
}

namespace {
// A store in memory that fails on its n-th write.
class FailingStore final : public optim::SwapStore {
 public:
  explicit FailingStore(int fail_at) : fail_at_(fail_at) {}
  size_t alignment() const override { return 4096; }
  void reserve(int64_t bytes) override { bytes_.resize(size_t(bytes)); }
  void read(int64_t offset, std::span<std::byte> dst) override {
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }
  void write(int64_t offset, std::span<const std::byte> src) override {
    TITAN_CHECK(++writes_ != fail_at_, "disk full (test)");
    std::memcpy(bytes_.data() + offset, src.data(), src.size());
  }
  std::string describe() const override { return "failing"; }

 private:
  int fail_at_, writes_ = 0;
  std::vector<std::byte> bytes_;
};
}  // namespace

TEST(SwappedMoments, AStoreErrorSurfacesFromTheStep) {
  for (const int fail_at : {1, 2, 4}) {  // the I/O thread's first and a later write, and the last (main thread)
    optim::SwappedMoments m({4096}, 8192, std::make_unique<FailingStore>(fail_at));
    ASSERT_EQ(m.chunk_count(), 4);
    try {
      m.for_each(optim::SwappedMoments::Access::update, [](const optim::SwappedMoments::Piece&) {});
      ADD_FAILURE() << "expected the store's error, write " << fail_at;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("disk full"), std::string::npos);
    }
    // The pipeline is usable afterwards (no job left pending).
    m.for_each(optim::SwappedMoments::Access::read, [](const optim::SwappedMoments::Piece&) {});
  }
}

TEST(FileSwapStore, AFolderThatCannotExistIsAClearError) {
  const fs::path file = temp("plain_file");
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "x";
  try {
    optim::FileSwapStore s((file / "optimizer.rank0.swap").string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find((file / "optimizer.rank0.swap").string()), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("swap_path"), std::string::npos) << e.what();
  }
  fs::remove_all(file.parent_path());
}

// More than the disk holds fails when the space is reserved, before any training, naming the size.
TEST(FileSwapStore, ADiskTooSmallFailsAtReserve) {
  optim::FileSwapStore s(temp("huge").string());
  try {
    s.reserve(int64_t(1) << 58);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot reserve"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("swap_path"), std::string::npos) << e.what();
  }
  fs::remove_all(temp(""));
}
