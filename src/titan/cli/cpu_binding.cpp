#include "titan/cli/cpu_binding.h"

#include <omp.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "titan/distributed/runtime.h"

namespace titan::cli {

namespace {

void set_affinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    std::fprintf(stderr, "titan: warning: cannot set this process's CPUs (%s): its threads may share one core\n",
                 std::strerror(errno));
}

}  // namespace

std::vector<int> launcher_cpus(bool openmp_bound_us) {
  if (!openmp_bound_us || omp_get_num_places() == 0) return distributed::allowed_cpus();
  std::vector<int> cpus;
  for (int p = 0; p < omp_get_num_places(); ++p) {
    std::vector<int> ids(size_t(omp_get_place_num_procs(p)));
    omp_get_place_proc_ids(p, ids.data());
    cpus.insert(cpus.end(), ids.begin(), ids.end());
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

void bind_threads(char** argv) {
  if (std::getenv("TITAN_NO_REEXEC")) return;
  const distributed::LaunchInfo launch = distributed::launch_info();
  const char* places_env = std::getenv("OMP_PLACES");
  const char* bind_env = std::getenv("OMP_PROC_BIND");
  const bool bound_already = (places_env && std::strchr(places_env, '{')) || (bind_env && strcasecmp(bind_env, "false") == 0);
  if (launch.local_size > 1 && !bound_already) {
    const std::vector<int> cpus = launcher_cpus(bind_env != nullptr);
    // The affinity survives execv: give the next process the launcher's CPUs back, for its
    // OpenMP runtime to place this rank's threads on its share of them.
    set_affinity(cpus);
    const auto [share, places] = distributed::thread_share(launch, cpus, int(sysconf(_SC_NPROCESSORS_ONLN)));
    const char* user_threads = std::getenv("OMP_NUM_THREADS");
    const int threads = user_threads ? std::max(1, std::atoi(user_threads)) : share;
    if (threads > share)
      std::fprintf(stderr,
                   "titan: warning: rank %d: OMP_NUM_THREADS=%d, but its share of this host is %d CPU%s (%d ranks here "
                   "on %ld CPUs): its threads will share cores. Set OMP_NUM_THREADS <= %d, or run fewer ranks per host\n",
                   launch.rank, threads, share, share == 1 ? "" : "s", launch.local_size, sysconf(_SC_NPROCESSORS_ONLN),
                   share);
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    if (!places.empty()) setenv("OMP_PLACES", places.c_str(), 1);
    setenv("OMP_PROC_BIND", "close", 1);
  } else {
    if (bind_env) return;
    setenv("OMP_PROC_BIND", "close", 0);
    setenv("OMP_PLACES", "cores", 0);
  }
  setenv("TITAN_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run unbound
}

void hand_cpus_to_child(const std::vector<int>& cpus) {
  if (!cpus.empty()) set_affinity(cpus);
  unsetenv("TITAN_NO_REEXEC");
}

}  // namespace titan::cli
