// main() of the multi-rank tests (tests/distributed, run by ctest under mpirun): every rank runs
// every test; rank 0 prints the usual report, the others only their failures. The exit code is
// each rank's own, so mpirun fails when any rank does.
#include <gtest/gtest.h>

#include "titan/distributed/runtime.h"

namespace {

// Prints only failed assertions, prefixed with the rank.
class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  titan::distributed::CommEngine& engine = titan::distributed::init_runtime();
  engine.set_timeout(120);
  if (engine.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(engine.world_rank()));
  }
  const int rc = RUN_ALL_TESTS();
  titan::distributed::shutdown_runtime();
  return rc;
}
