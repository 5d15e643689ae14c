// How titan's processes bind their OpenMP threads to CPUs: once at start-up (bind_threads), and
// for the job `titan launch` starts (hand_cpus_to_child).
#pragma once

#include <vector>

namespace titan::cli {

// The CPUs the launcher let this process run on. With OMP_PROC_BIND set, the OpenMP runtime has
// already bound this thread to its first place when main runs, so the process's affinity says
// nothing of the launcher's: its places (made from the affinity it started with) do.
std::vector<int> launcher_cpus(bool openmp_bound_us);

// OpenMP reads its binding settings once at start-up, before main can set them; unbound threads
// can land on one core (measured here: half the FLOP/s). So the binary re-executes itself once
// with OMP_PROC_BIND/OMP_PLACES set. Under a launcher the ranks on one host split its CPUs: each
// binds its threads to its own share (distributed/runtime.h), also when OMP_NUM_THREADS is set
// (then that many threads on the share, with a warning when they outnumber it), unless a binding
// was already made: OMP_PLACES as an explicit list ("{0},{1}"), or OMP_PROC_BIND=false.
void bind_threads(char** argv);

// In a child process before its exec (titan launch's mpirun and, through it, the ranks): the
// launcher's CPUs back (cpus: launcher_cpus, taken in the parent) and the re-execution allowed
// again. A child inherits its parent's affinity, which OpenMP bound to one core, and the
// TITAN_NO_REEXEC the parent's re-execution set: without this every rank of a launched job ran
// on that one core, its threads on top of each other.
void hand_cpus_to_child(const std::vector<int>& cpus);

}  // namespace titan::cli
