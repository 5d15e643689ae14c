// Run by tests/e2e/watchdog_test.cpp under mpirun -np 2: three all-reduces on every rank, then
// rank 1 skips the fourth and sleeps. Rank 0's watchdog must fire after timeout_s (argv[2]),
// dump every rank's flight recorder into argv[1], and end the job naming the collective.
#include <unistd.h>

#include <cstdlib>

#include "titan/distributed/runtime.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  auto& engine = titan::distributed::init_runtime();
  engine.set_trace_folder(argv[1]);
  engine.set_timeout(std::atof(argv[2]));
  const auto& world = engine.world();
  titan::Tensor t = titan::Tensor::full({1000}, 1.0, titan::DType::f32);
  for (int i = 0; i < 3; ++i) world.all_reduce(t).wait();
  if (world.rank() == 1) sleep(60);  // skips the fourth: rank 0 waits on it alone
  else world.all_reduce(t).wait();
  titan::distributed::shutdown_runtime();
  return 0;
}
