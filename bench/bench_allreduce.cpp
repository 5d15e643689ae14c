// All-reduce over the world, as the trainer issues it (ProcessGroup::all_reduce of an f32 tensor:
// reduce-scatter then all-gather on the communication thread). For each size from 4 bytes to
// 64 MiB: the median time of a call, and the bus bandwidth 2 (N-1)/N x bytes / time (what each
// rank's link carries; nccl-tests' convention). One JSON line per size from rank 0.
// bench/multihost.sh runs it over shared memory and across network-namespace hosts.
//   mpirun -np N bench_allreduce [--max-mib 64] [--repeats 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/distributed/comm_engine.h"
#include "titan/distributed/process_group.h"
#include "titan/distributed/runtime.h"

using namespace titan;

int main(int argc, char** argv) {
  int64_t max_mib = 64, repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max-mib") == 0) max_mib = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoll(argv[i + 1]);
  }
  if (repeats < 1 || max_mib < 1) {
    std::fprintf(stderr, "bench_allreduce: --repeats and --max-mib must be >= 1\n");
    return 2;
  }
  distributed::CommEngine& engine = distributed::init_runtime();
  const distributed::ProcessGroup& world = engine.world();
  const int n = world.size();
  for (int64_t bytes = 4; bytes <= max_mib << 20; bytes *= 4) {
    Tensor t = Tensor::zeros({bytes / 4}, DType::f32, MemCategory::temporaries);
    world.all_reduce(t).wait();  // warm-up: buffers and connections
    std::vector<double> seconds;
    for (int64_t r = 0; r < repeats; ++r) {
      world.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      world.all_reduce(t).wait();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(seconds.begin(), seconds.end());
    std::vector<double> median = {seconds[seconds.size() / 2]};
    world.all_reduce(std::span<double>(median), distributed::ReduceOp::max);  // the slowest rank's
    if (world.rank() == 0)
      std::printf("{\"ranks\": %d, \"hosts\": %d, \"bytes\": %lld, \"median_us\": %.1f, \"bus_gbps\": %.3f}\n", n,
                  engine.hosts(), static_cast<long long>(bytes), median[0] * 1e6,
                  n > 1 ? 2.0 * (n - 1) / n * double(bytes) / median[0] / 1e9 : 0.0);
  }
  distributed::shutdown_runtime();
  return 0;
}
