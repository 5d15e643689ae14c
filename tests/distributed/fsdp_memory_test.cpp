// FSDP holds no more unsharded parameters than the units in flight: the unit computing, the one
// prefetched, the output head (kept between its forward and backward by default) and the root
// (final norm). With MTP the embedding and the head run twice, and each MTP module is a unit of
// its own; after the step nothing stays gathered.
#include <algorithm>

#include "distributed/common.h"
#include "titan/distributed/fsdp.h"
#include "titan/models/causal_lm.h"

using namespace titan;
using namespace titan::test;

namespace {

// The f32 bytes a unit's gathered parameters take: whole rows, padded to a multiple of the ranks.
int64_t unit_bytes(models::CausalLM& m, const std::string& prefix) {
  const int64_t n = world().size();
  int64_t bytes = 0;
  for (auto& [name, p] : m.named_parameters()) {
    if (!prefix.empty() && !name.starts_with(prefix + ".")) continue;
    const int64_t d0 = p->var.shape()[0], rest = p->var.shape().numel() / d0;
    bytes += (d0 + n - 1) / n * n * rest * 4;
  }
  return bytes;
}

}  // namespace

TEST(FsdpMemory, OnlyTheUnitsInFlightAreGathered) {
  for (const int64_t mtp : {0, 1}) {
    models::ModelOptions o;
    o.mtp_layers = mtp;
    auto model = models::build_model("deepseek_v3", "debugmodel", 257, 32, o);
    const auto units = model->sharding_units();
    distributed::FsdpOptions fo;
    fo.seed = 3;
    distributed::Fsdp fsdp(*model, units, world(), nullptr, fo);
    // The largest two units (current + prefetched), the head and the root (everything outside units).
    std::vector<int64_t> sizes;
    int64_t in_units = 0;
    for (const nn::ShardingUnit& u : units) {
      sizes.push_back(unit_bytes(*model, u.name));
      in_units += sizes.back();
    }
    std::sort(sizes.rbegin(), sizes.rend());
    const int64_t root = unit_bytes(*model, "") - in_units, head = unit_bytes(*model, "output");
    const int64_t bound = sizes[0] + sizes[1] + head + root;
    Tensor tokens = Tensor::empty({1, 16}, DType::i32), targets = Tensor::empty({16}, DType::i32);
    for (int i = 0; i < 16; ++i) tokens.data<int32_t>()[i] = (i * 7 + world().rank()) % 257, targets.data<int32_t>()[i] = (i * 5) % 257;
    for (int step = 0; step < 2; ++step) {
      fsdp.zero_grad();
      fsdp.reset_peak_gathered();
      fsdp.begin_forward(true);
      models::TrainingLoss loss = model->training_loss(tokens, targets);
      // After the forward only the head and the root stay gathered (nothing prefetched is left).
      EXPECT_EQ(fsdp.gathered_bytes(), head + root) << "mtp " << mtp;
      autograd::backward(loss.total);
      fsdp.finish_backward();
      EXPECT_EQ(fsdp.gathered_bytes(), 0) << "mtp " << mtp << ": gathered after the step";
      EXPECT_LE(fsdp.peak_gathered_bytes(), bound) << "mtp " << mtp;
      EXPECT_GT(fsdp.peak_gathered_bytes(), head + root) << "mtp " << mtp;
      for (const nn::TrainableParam& p : fsdp.params()) {
        if (p.var.value().numel() == 0) continue;  // a shard of padding rows only
        EXPECT_TRUE(p.var.grad().defined()) << p.name << " got no gradient, mtp " << mtp;
      }
    }
  }
}
