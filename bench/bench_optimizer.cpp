// The optimizer step on a whole model, one rank: AdamW over every parameter against Muon for the
// matrices with AdamW for the rest ([optimizer] name = "Muon"), time per parameter, and the
// Newton-Schulz share of Muon's step (the iteration alone over every Muon matrix), its GEMMs in f32
// and in bf16 (optimizer.muon_ns_dtype); f32 masters, with and without the bf16 compute copies the
// step refreshes under mixed precision. Also the optimizer state each holds (allocator category
// optimizer_state).
// Under mpirun with N ranks: FSDP N as the trainer lays it out (each rank holds rows
// [r ceil(rows / N), ...) of every parameter), Muon's owner-compute over all of them (optim/muon.h)
// against AdamW on the shards: the step's time (the slowest rank's best), per parameter of the
// model and of a rank's shard, and the Newton-Schulz of the matrices each rank owns, alone.
//
//   build/bench/bench_optimizer [--model llama3] [--flavor 125M] [--vocab 2048] [--reps 3]
//   mpirun -np 4 build/bench/bench_optimizer ...   (OMP_NUM_THREADS=1: one thread per rank)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "bench_common.h"
#include "titan/core/allocator.h"
#include "titan/core/rng.h"
#include "titan/distributed/runtime.h"
#include "titan/models/causal_lm.h"
#include "titan/models/family.h"
#include "titan/optim/muon_adamw.h"

using namespace titan;

namespace {

void fill_grads(models::CausalLM& model) {
  Generator rng(17, "bench optimizer");
  for (auto& [name, p] : model.named_parameters()) {
    Tensor& g = p->var.ensure_grad();
    for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = 0.01f * (rng.next_uniform() - 0.5f);
  }
}

int64_t optimizer_bytes() { return memory_stats().live[size_t(MemCategory::optimizer_state)]; }

void fill_uniform(Tensor& t, Generator& rng, float scale) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * (rng.next_uniform() - 0.5f);
}

// FSDP over `world`: this rank's rows of every parameter of a model built without storage, with
// random values and gradients, each piece's slice in the whole parameter as FSDP sets it.
std::vector<nn::TrainableParam> fsdp_pieces(const std::vector<std::pair<std::string, nn::Parameter*>>& named,
                                            const distributed::ProcessGroup& world) {
  const int n = world.size(), me = world.rank();
  Generator rng(17 + uint64_t(me), "bench optimizer");
  std::vector<nn::TrainableParam> out;
  for (const auto& [name, p] : named) {
    const Shape whole = p->var.shape();
    const int64_t per = (whole[0] + n - 1) / n, begin = std::min(whole[0], me * per);
    Shape local = whole, offsets = whole;
    local[0] = std::min(whole[0], begin + per) - begin;
    for (int d = 0; d < int(offsets.size()); ++d) offsets[d] = d == 0 ? begin : 0;
    nn::TrainableParam t;
    t.name = name;
    t.var = autograd::Variable(Tensor::empty(local, DType::f32, MemCategory::parameters), true, name);
    fill_uniform(t.var.mutable_value(), rng, 0.04f);
    fill_uniform(t.var.ensure_grad(), rng, 0.01f);
    t.weight_decay = p->weight_decay;
    t.slice = {whole, offsets};
    out.push_back(std::move(t));
  }
  return out;
}

// The slowest rank's value.
double slowest(const distributed::ProcessGroup& world, double seconds) {
  world.all_reduce(std::span<double>(&seconds, 1), distributed::ReduceOp::max);
  return seconds;
}

int run_fsdp(const distributed::ProcessGroup& world, const std::string& model_name, const std::string& flavor,
             int64_t vocab, int reps) {
  std::unique_ptr<models::CausalLM> model;
  {
    nn::ParametersWithoutStorage no_storage;
    model = models::build_model(model_name, flavor, vocab, 128, models::ModelOptions{});
  }
  const auto named = model->named_parameters();
  const std::vector<nn::TrainableParam> pieces = fsdp_pieces(named, world);
  const double params = double(model->num_parameters()), per_rank = params / world.size();
  const bool lead = world.rank() == 0;
  if (lead)
    std::printf("%s %s: %.1fM parameters, FSDP %d (%d ranks of %s thread(s) each)\n", model_name.c_str(),
                flavor.c_str(), params / 1e6, world.size(), world.size(),
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "?");
  auto timed = [&](const std::function<void()>& step) {
    return slowest(world, bench::time_best([&] { world.barrier().wait(), step(); }, reps, 1));
  };
  double adamw_s = 0;
  {
    optim::AdamW adamw(pieces, kernels::AdamWParams{});
    adamw_s = timed([&] { adamw.step(1e-4f); });
  }
  if (lead)
    std::printf("AdamW %8.1f ms (%5.2f ns/param of the model, %5.2f ns/param of a rank's shard)\n", adamw_s * 1e3,
                adamw_s / params * 1e9, adamw_s / per_rank * 1e9);
  for (const DType ns : {DType::f32, DType::bf16}) {
    optim::MuonConfig config;
    config.ns_dtype = ns;
    optim::MuonParamGroups groups = optim::split_muon_groups(pieces, named);
    // The iteration alone over the matrices this rank owns (the Muon below picks the same owners:
    // every rank holds rows of every llama3 matrix), on random matrices.
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const nn::TrainableParam& p : groups.muon)
      shapes.emplace_back(p.slice.global_shape[0], p.slice.global_shape[1]);
    const std::vector<int> owners = optim::muon_owners(shapes, world.size());
    optim::NewtonSchulzScratch scratch;
    if (ns == DType::bf16) scratch.fit_bf16();
    std::vector<Tensor> owned;
    Generator rng(5, "bench optimizer owned");
    for (size_t i = 0; i < shapes.size(); ++i)
      if (owners[i] == world.rank()) {
        scratch.fit(shapes[i].first, shapes[i].second);
        owned.push_back(Tensor::empty({shapes[i].first, shapes[i].second}, DType::f32, MemCategory::temporaries));
        fill_uniform(owned.back(), rng, 0.01f);
      }
    const auto owned_iterations = [&] {
      for (Tensor& m : owned) optim::newton_schulz(m.data<float>(), m.size(0), m.size(1), config, scratch);
    };
    const double ns_s = slowest(world, bench::time_best(owned_iterations, reps, 1));
    owned.clear();
    optim::MuonAdamW muon(std::move(groups), config, 1.0, kernels::AdamWParams{}, std::nullopt, &world);
    const double muon_s = timed([&] { muon.step(1e-4f); });
    if (lead)
      std::printf("Muon+AdamW, Newton-Schulz in %s: %8.1f ms (%6.2f ns/param of the model, %6.2f of a rank's shard; "
                  "%.1fx AdamW); Newton-Schulz of the owned matrices alone %8.1f ms (%.0f%% of the step); "
                  "%.1f MiB exchanged per rank\n",
                  ns == DType::bf16 ? "bf16" : "f32 ", muon_s * 1e3, muon_s / params * 1e9, muon_s / per_rank * 1e9,
                  muon_s / adamw_s, ns_s * 1e3, 100 * ns_s / muon_s,
                  double(muon.muon().exchanged_elements()) * 4 / (1 << 20));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "llama3", flavor = "125M";
  int64_t vocab = 2048;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model_name = v;
    else if (a == "--flavor") flavor = v;
    else if (a == "--vocab") vocab = std::atoll(v.c_str());
    else if (a == "--reps") reps = std::atoi(v.c_str());
  }
  distributed::CommEngine& engine = distributed::init_runtime();
  if (engine.world_size() > 1) {
    const int rc = run_fsdp(engine.world(), model_name, flavor, vocab, reps);
    distributed::shutdown_runtime();
    return rc;
  }
  auto model = models::build_model(model_name, flavor, vocab, 128, models::ModelOptions{});
  model->init_parameters(1);
  const double params = double(model->num_parameters());
  std::printf("%s %s: %.1fM parameters, %d thread(s)\n", model_name.c_str(), flavor.c_str(), params / 1e6,
              std::atoi(std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "0"));
  for (const DType compute : {DType::f32, DType::bf16}) {
    model->set_compute_dtype(compute);
    fill_grads(*model);
    const char* what = compute == DType::bf16 ? "bf16 compute copies" : "f32";
    double adamw_s = 0, muon_s = 0, ns_s = 0;
    int64_t adamw_bytes = 0, muon_bytes = 0, muon_params = 0;
    {
      const int64_t before = optimizer_bytes();
      optim::AdamW adamw(model->named_parameters(), kernels::AdamWParams{});
      adamw_bytes = optimizer_bytes() - before;
      adamw_s = bench::time_best([&] { adamw.step(1e-4f); }, reps, 1);
    }
    std::printf("%-20s AdamW %8.1f ms (%5.2f ns/param)\n", what, adamw_s * 1e3, adamw_s / params * 1e9);
    for (const DType ns : {DType::f32, DType::bf16}) {
      optim::MuonConfig config;
      config.ns_dtype = ns;
      const int64_t before = optimizer_bytes();
      optim::MuonParamGroups groups =
          optim::split_muon_groups(nn::trainable_params(model->named_parameters()), model->named_parameters());
      muon_params = 0;
      // The iteration alone, over every Muon matrix (experts one by one), on copies of the gradients.
      optim::NewtonSchulzScratch scratch;
      if (ns == DType::bf16) scratch.fit_bf16();
      std::vector<Tensor> inputs;
      std::vector<std::array<int64_t, 3>> shapes;  // count, rows, cols
      for (const nn::TrainableParam& p : groups.muon) {
        const Shape sh = p.var.value().shape();
        const int64_t count = sh.size() == 3 ? sh[0] : 1, rows = sh[sh.size() - 2], cols = sh[sh.size() - 1];
        scratch.fit(rows, cols);
        inputs.push_back(p.var.grad().clone());
        shapes.push_back({count, rows, cols});
        muon_params += p.var.value().numel();
      }
      ns_s = bench::time_best(
          [&] {
            for (size_t i = 0; i < inputs.size(); ++i)
              for (int64_t e = 0; e < shapes[i][0]; ++e)
                optim::newton_schulz(inputs[i].data<float>() + e * shapes[i][1] * shapes[i][2], shapes[i][1],
                                     shapes[i][2], config, scratch);
          },
          reps, 1);
      const int64_t scratch_bytes = scratch.bytes();
      inputs.clear();
      optim::MuonAdamW muon(std::move(groups), config, 1.0, kernels::AdamWParams{});
      muon_bytes = optimizer_bytes() - before - scratch_bytes;
      muon_s = bench::time_best([&] { muon.step(1e-4f); }, reps, 1);
      std::printf("%-20s Muon+AdamW, Newton-Schulz in %s: %8.1f ms (%6.2f ns/param, %.1fx AdamW); Newton-Schulz "
                  "alone %8.1f ms (%.0f%% of the step)\n",
                  what, ns == DType::bf16 ? "bf16" : "f32 ", muon_s * 1e3, muon_s / params * 1e9, muon_s / adamw_s,
                  ns_s * 1e3, 100 * ns_s / muon_s);
    }
    if (compute == DType::f32)
      std::printf("%-20s state: AdamW %.1f MiB, Muon+AdamW %.1f MiB (%.2f; %.1fM of the parameters in Muon's group)\n",
                  "", double(adamw_bytes) / (1 << 20), double(muon_bytes) / (1 << 20),
                  double(muon_bytes) / double(adamw_bytes), double(muon_params) / 1e6);
  }
  distributed::shutdown_runtime();
  return 0;
}
