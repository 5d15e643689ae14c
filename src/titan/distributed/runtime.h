// The process's place in a job and its start-up: which launcher started it (mpirun, srun, or none:
// a 1-rank run), how many threads it should use, and the communication engine.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "titan/distributed/comm_engine.h"

namespace titan::distributed {

// What the launcher's environment says (no MPI call): Open MPI's OMPI_COMM_WORLD_*, Slurm's
// SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, or PMI's PMI_RANK / PMI_SIZE. Without any, one rank.
struct LaunchInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this host
  std::string launcher;                // "mpirun", "srun", "pmi", or "" (none)
  bool launched() const { return !launcher.empty(); }
};
LaunchInfo launch_info();

// OpenMP threads and places for a rank when the user set neither OMP_NUM_THREADS nor
// OMP_PLACES: {OMP_NUM_THREADS, OMP_PLACES}. A rank free to run on the whole host (`cpus`, its
// affinity mask, has all host_cpus) takes its local rank's even share of them; more ranks than
// CPUs share them one each. A rank the launcher bound to part of the host keeps those CPUs, so
// a launcher that binds several ranks to one socket oversubscribes it: launch with
// `--bind-to none` (scripts/mpirun.sh does) or set OMP_NUM_THREADS.
std::pair<int, std::string> thread_share(const LaunchInfo& launch, const std::vector<int>& cpus, int host_cpus);
// The CPUs the calling thread may run on (sched_getaffinity; the process's before any thread is bound).
std::vector<int> allowed_cpus();

// Starts the communication engine, with MPI when a launcher started this process; the world's
// size and rank must match what the launcher said. Idempotent.
CommEngine& init_runtime();
// Stops it (MPI_Finalize). Call once at exit, on every rank.
void shutdown_runtime();

}  // namespace titan::distributed
