// distributed::Deadline: an operation that overruns calls the expiry with its name and limit; one
// that ends in time disarms it at once, without waiting for the limit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "titan/distributed/deadline.h"

using titan::distributed::Deadline;

TEST(Deadline, AnOverrunCallsTheExpiryNamingTheOperation) {
  std::atomic<int> calls{0};
  std::string what;
  double limit = 0;
  {
    const Deadline d("MPI_Comm_split of group world", 0.05, [&](const std::string& w, double s) {
      what = w, limit = s;
      ++calls;
    });
    // Polled, not one sleep: on a loaded machine the deadline's thread may run late.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!d.expired() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(d.expired());
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(what, "MPI_Comm_split of group world");
  EXPECT_DOUBLE_EQ(limit, 0.05);
}

TEST(Deadline, AnOperationInTimeDisarmsItAtOnce) {
  std::atomic<int> calls{0};
  const auto t0 = std::chrono::steady_clock::now();
  {
    const Deadline d("MPI_Finalize", 30, [&](const std::string&, double) { ++calls; });
    EXPECT_FALSE(d.expired());
  }
  {
    const Deadline forever("MPI_Init", 0, [&](const std::string&, double) { ++calls; });  // no limit
  }
  EXPECT_EQ(calls.load(), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
}
