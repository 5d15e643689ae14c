#include "titan/distributed/device_mesh.h"

#include <fmt/format.h>

#include "titan/core/error.h"
#include "titan/distributed/comm_engine.h"

namespace titan::distributed {

namespace {

// TorchTitan's [parallelism] keys, in mesh order.
constexpr const char* kKeys[kMeshDims] = {"pipeline_parallel_degree", "data_parallel_replicate_degree",
                                          "data_parallel_shard_degree", "context_parallel_degree",
                                          "tensor_parallel_degree"};

std::string divisors(int n) {
  std::string out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

}  // namespace

const char* mesh_dim_name(MeshDim d) {
  constexpr const char* names[kMeshDims] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
  return names[size_t(d)];
}

std::array<int, kMeshDims> resolve_mesh(const MeshShape& s, int world, const std::string& source) {
  const std::array<int64_t, kMeshDims> given = {s.pp, s.dp_replicate, s.dp_shard, s.cp, s.tp};
  std::string listing;
  for (int d = 0; d < kMeshDims; ++d) {
    TITAN_CHECK(given[size_t(d)] >= 1 || (d == int(MeshDim::dp_shard) && given[size_t(d)] == -1),
                fmt::format("{}: parallelism.{} = {} is not a degree", source, kKeys[d], given[size_t(d)]),
                d == int(MeshDim::dp_shard) ? "use an integer >= 1, or -1 for the ranks the other degrees leave"
                                            : "use an integer >= 1");
    listing += fmt::format("{}{} = {}", d ? ", " : "", kKeys[d], given[size_t(d)]);
  }
  int64_t others = 1;
  for (int d = 0; d < kMeshDims; ++d)
    if (d != int(MeshDim::dp_shard)) others *= given[size_t(d)];
  std::array<int, kMeshDims> out{};
  for (int d = 0; d < kMeshDims; ++d) out[size_t(d)] = int(given[size_t(d)]);
  if (s.dp_shard == -1) {
    TITAN_CHECK(world % others == 0,
                fmt::format("{}: the job has {} ranks, which the other [parallelism] degrees ({}; product {}) do not divide",
                            source, world, listing, others),
                fmt::format("choose degrees whose product divides {} (its divisors: {}), or launch a multiple of {} ranks",
                            world, divisors(world), others));
    out[size_t(MeshDim::dp_shard)] = int(world / others);
    return out;
  }
  const int64_t product = others * s.dp_shard;
  if (product != world) {
    const std::string fix =
        world % others == 0
            ? fmt::format("set parallelism.data_parallel_shard_degree = {} (or -1, which fills it in)", world / others)
            : fmt::format("choose degrees whose product is {} (its divisors: {}), or launch {} ranks", world,
                          divisors(world), product);
    TITAN_FAIL(fmt::format("{}: the [parallelism] degrees ({}) multiply to {} ranks, but the job has {}", source,
                           listing, product, world),
               fix);
  }
  return out;
}

void check_expert_degree(const std::array<int, kMeshDims>& degrees, int64_t ep, const std::string& source,
                         bool expert_tp) {
  const int tp = degrees[size_t(MeshDim::tp)];
  const int block = degrees[size_t(MeshDim::dp_shard)] * degrees[size_t(MeshDim::cp)] * (expert_tp ? 1 : tp);
  const auto fits = [&](int64_t d) { return d >= 1 && block % d == 0 && (expert_tp || d == 1 || d % tp == 0); };
  if (fits(ep)) return;
  std::string works;
  for (int d = 1; d <= block; ++d)
    if (fits(d)) works += (works.empty() ? "" : ", ") + std::to_string(d);
  const std::string from =
      expert_tp ? fmt::format("data_parallel_shard_degree x context_parallel_degree = {} x {} = {} (under "
                              "moe_tp_scheme = \"gather\" the routed experts are split over TP, so EP borrows no TP "
                              "ranks and must divide the rest)",
                              degrees[size_t(MeshDim::dp_shard)], degrees[size_t(MeshDim::cp)], block)
                : fmt::format("data_parallel_shard_degree x context_parallel_degree x tensor_parallel_degree = {} x {} "
                              "x {} = {} (it must divide them and be a multiple of tensor_parallel_degree)",
                              degrees[size_t(MeshDim::dp_shard)], degrees[size_t(MeshDim::cp)], tp, block);
  TITAN_FAIL(fmt::format("{}: parallelism.expert_parallel_degree = {} cannot borrow its ranks from {}", source, ep, from),
             "use one of " + works + ", or give data_parallel_shard_degree more ranks");
}

DeviceMesh::DeviceMesh(const ProcessGroup& world, const std::array<int, kMeshDims>& degrees, int ep, bool expert_tp)
    : degrees_(degrees), world_size_(world.size()), ep_degree_(ep) {
  int64_t product = 1;
  for (int d : degrees_) product *= d;
  TITAN_CHECK(product == world.size(), "DeviceMesh: degrees " + str() + " do not multiply to the world size " +
                                           std::to_string(world.size()));
  int rest = world.rank();
  for (int d = kMeshDims - 1; d >= 0; --d) {
    coords_[size_t(d)] = rest % degrees_[size_t(d)];
    rest /= degrees_[size_t(d)];
  }
  for (int d = 0; d < kMeshDims; ++d) {
    std::array<bool, kMeshDims> mask{};
    mask[size_t(d)] = true;
    groups_[size_t(d)] = make_group(world, mask, mesh_dim_name(MeshDim(d)));
  }
  dp_ = make_group(world, {false, true, true, false, false}, "dp");
  fsdp_ = make_group(world, {false, false, true, true, false}, "fsdp");
  loss_ = make_group(world, {false, true, true, true, false}, "loss");
  if (degree(MeshDim::tp) > 1) fsdp_tp_ = make_group(world, {false, false, true, true, true}, "fsdp_tp");
  check_expert_degree(degrees_, ep, "DeviceMesh", expert_tp);
  // Expert parallelism: runs of ep consecutive ranks of dp_shard x cp x tp (with expert_tp: of
  // dp_shard x cp at this rank's TP coordinate), and across them the ranks at the same place in
  // their run.
  const auto at = [&](MeshDim d) { return int64_t(coords_[size_t(d)]); };
  const int64_t tp = expert_tp ? 1 : degree(MeshDim::tp);
  const int64_t outer = (at(MeshDim::pp) * degree(MeshDim::dp_replicate) + at(MeshDim::dp_replicate)) *
                            (expert_tp ? degree(MeshDim::tp) : 1) +
                        (expert_tp ? at(MeshDim::tp) : 0);
  const int64_t block = int64_t(degree(MeshDim::dp_shard)) * degree(MeshDim::cp) * tp;
  const int64_t index = (at(MeshDim::dp_shard) * degree(MeshDim::cp) + at(MeshDim::cp)) * tp + (expert_tp ? 0 : at(MeshDim::tp));
  CommEngine& engine = CommEngine::get();
  ep_ = engine.split(world, int(outer * (block / ep) + index / ep), int(index % ep), "ep");
  efsdp_ = engine.split(world, int(outer * ep + index % ep), int(index / ep), "efsdp");
}

std::unique_ptr<ProcessGroup> DeviceMesh::make_group(const ProcessGroup& world, std::array<bool, kMeshDims> mask,
                                                     const std::string& name) {
  // Colour: the coordinates outside the group; key: the row-major index inside it.
  int64_t color = 0, key = 0;
  for (int d = 0; d < kMeshDims; ++d) {
    if (mask[size_t(d)]) key = key * degrees_[size_t(d)] + coords_[size_t(d)];
    else color = color * degrees_[size_t(d)] + coords_[size_t(d)];
  }
  return CommEngine::get().split(world, int(color), int(key), name);
}

std::string DeviceMesh::str() const {
  std::string out;
  for (int d = 0; d < kMeshDims; ++d) out += fmt::format("{}{} {}", d ? " x " : "", mesh_dim_name(MeshDim(d)), degrees_[size_t(d)]);
  if (ep_degree_ > 1) out += fmt::format(", ep {}", ep_degree_);
  return out;
}

}  // namespace titan::distributed
