#include "titan/distributed/runtime.h"

#include <sched.h>

#include <cstdlib>

#include "titan/core/error.h"

namespace titan::distributed {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' ? int(x) : fallback;
}

// The leading integer of a variable such as SLURM_TASKS_PER_NODE = "2(x3)" (2 tasks on each of 3 nodes).
int env_leading_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end != v ? int(x) : fallback;
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun";
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    l.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS")) {
    l.launcher = "srun";
    l.rank = env_int("SLURM_PROCID", 0);
    l.world_size = env_int("SLURM_NTASKS", 1);
    l.local_rank = env_int("SLURM_LOCALID", 0);
    l.local_size = std::max(1, env_leading_int("SLURM_TASKS_PER_NODE", 1));
  } else if (std::getenv("PMI_SIZE")) {
    l.launcher = "pmi";
    l.rank = env_int("PMI_RANK", 0);
    l.world_size = env_int("PMI_SIZE", 1);
    l.local_rank = env_int("MPI_LOCALRANKID", 0);
    l.local_size = env_int("MPI_LOCALNRANKS", 1);
  }
  return l;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::pair<int, std::string> thread_share(const LaunchInfo& launch, const std::vector<int>& cpus, int host_cpus) {
  const int n = int(cpus.size());
  if (n == 0) return {1, ""};
  // Bound by the launcher to part of the host: those CPUs are this rank's. Free to run anywhere:
  // the rank takes its local rank's share.
  int first = 0, count = n;
  if (launch.local_size > 1 && n >= host_cpus) {
    const int share = n / launch.local_size;
    if (share >= 1) first = launch.local_rank * share, count = share;
    else first = launch.local_rank % n, count = 1;  // oversubscribed: one CPU each, round robin
  }
  std::string places;
  for (int i = 0; i < count; ++i) places += (i ? "," : "") + std::string("{") + std::to_string(cpus[size_t(first + i)]) + "}";
  return {count, places};
}

CommEngine& init_runtime() {
  CommEngine& e = CommEngine::get();
  if (e.started()) return e;
  const LaunchInfo l = launch_info();
  e.start(l.launched());
  TITAN_CHECK(!l.launched() || (e.world_size() == l.world_size && e.world_rank() == l.rank),
              "MPI reports rank " + std::to_string(e.world_rank()) + " of " + std::to_string(e.world_size()) + " but " +
                  l.launcher + " set rank " + std::to_string(l.rank) + " of " + std::to_string(l.world_size),
              "launch titan with the mpirun of the Open MPI it was built against (or srun --mpi=pmix)");
  return e;
}

void shutdown_runtime() { CommEngine::get().stop(); }

}  // namespace titan::distributed
