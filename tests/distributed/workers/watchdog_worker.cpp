// Run by tests/e2e/watchdog_test.cpp under mpirun -np 2: argv[1] the flight-recorder folder,
// argv[2] the watchdog's timeout and the start-up deadline (seconds), argv[3] the hang:
//   skip   three all-reduces on every rank, then rank 1 skips the fourth and sleeps: rank 0's
//          watchdog fires, dumps every rank's recorder and ends the job naming the collective
//   p2p    rank 0 sends three tensors with tag 0 and two with tag 1, rank 1 receives them and
//          then a fourth with tag 0 that never comes: its watchdog names the missing send
//   split  rank 1 joins the all-gather that starts a split but never calls MPI_Comm_split:
//          rank 0's start-up deadline ends the job naming the split
//   stop   rank 1 never reaches the end: rank 0's barrier in stop() ends the job
//   init   rank 1 sleeps before MPI starts: rank 0's MPI_Init deadline ends the job
//   throw  the communication thread of every rank throws on its next request: the caller's wait()
//          throws an error naming it (printed as "caught: ..."), later requests fail the same way;
//          settle() (destructors' wait) returns without throwing; each rank exits 1 once both printed
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "titan/core/error.h"
#include "titan/distributed/runtime.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argc > 3 ? argv[3] : "skip";
  auto& engine = titan::distributed::CommEngine::get();
  engine.set_trace_folder(argv[1]);
  // MPI_Init waits for the slower rank: the short start-up deadline covers it only in the mode that
  // tests it, so that a loaded machine's slow start fails no other mode (split and stop read the
  // deadline when they run, after this).
  if (mode == "init") engine.set_init_timeout(std::atof(argv[2]));
  if (mode == "init" && titan::distributed::launch_info().rank == 1) sleep(60);
  titan::distributed::init_runtime();
  engine.set_init_timeout(std::atof(argv[2]));
  engine.set_timeout(std::atof(argv[2]));
  const auto& world = engine.world();
  titan::Tensor t = titan::Tensor::full({1000}, 1.0, titan::DType::f32);
  if (mode == "skip") {
    for (int i = 0; i < 3; ++i) world.all_reduce(t).wait();
    if (world.rank() == 1) sleep(60);  // skips the fourth: rank 0 waits on it alone
    else world.all_reduce(t).wait();
  } else if (mode == "p2p") {
    world.all_reduce(t).wait();
    for (int i = 0; i < 5; ++i) {
      const int tag = i < 3 ? 0 : 1;
      if (world.rank() == 0) world.send(t, 1, tag).wait();
      else world.recv(t, 0, tag).wait();
    }
    if (world.rank() == 0) sleep(60);  // never sends the fourth with tag 0
    else world.recv(t, 0, 0).wait();
  } else if (mode == "split") {
    world.all_reduce(t).wait();
    if (world.rank() == 0) engine.split(world, 0, 0, "half");
    else world.all_gather(std::string("0 1")), sleep(60), std::_Exit(4);  // the split's first half only
  } else if (mode == "stop") {
    world.all_reduce(t).wait();
    if (world.rank() == 1) sleep(60);
  } else if (mode == "throw") {
    engine.fail_next_request_for_test("injected by watchdog_worker");
    for (int i = 0; i < 2; ++i) {
      try {
        world.all_reduce(t).wait();
        std::printf("rank %d: all_reduce %d completed\n", world.rank(), i);
      } catch (const titan::Error& e) {
        std::printf("rank %d caught: %s\n", world.rank(), e.message().c_str());
      }
      std::fflush(stdout);
    }
    world.all_reduce(t).settle();  // as a destructor waits: no throw
    std::printf("rank %d: a failed request settles without throwing\n", world.rank());
    std::fflush(stdout);
    // The job cannot go on. The first rank to end makes mpirun end the other, so each waits until
    // the other printed too (a file each: communication is down), then ends on its own.
    const std::string folder = argv[1];
    const auto printed = [&](int rank) { return folder + "/printed." + std::to_string(rank); };
    if (FILE* f = std::fopen(printed(world.rank()).c_str(), "w")) std::fclose(f);
    for (int i = 0; i < 3000 && access(printed(1 - world.rank()).c_str(), F_OK) != 0; ++i) usleep(10000);
    std::_Exit(1);
  }
  titan::distributed::shutdown_runtime();
  return 0;
}
