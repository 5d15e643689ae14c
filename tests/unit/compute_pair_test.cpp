// The compute pair (distributed/compute_pair.h): two pieces on two threads that take turns at
// each handoff, never running at once, in an order fixed by the program alone.
#include "titan/distributed/compute_pair.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using titan::distributed::ComputePair;
using titan::distributed::handoff;

namespace {

// Records what each piece did, and checks that no two run at once.
struct Log {
  std::vector<std::string> events;
  std::atomic<int> inside{0};
  int most_inside = 0;
  void step(const std::string& what) {
    const int now = ++inside;
    most_inside = std::max(most_inside, now);
    events.push_back(what);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // room for the other thread to break in
    --inside;
  }
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += (s.empty() ? "" : " ") + e;
  return s;
}

TEST(ComputePair, PiecesTakeTurnsAtEachHandoff) {
  ComputePair pair;
  Log log;
  std::thread::id first_thread, second_thread;
  pair.run(
      [&] {
        first_thread = std::this_thread::get_id();
        log.step("a1"), handoff(), log.step("a2"), handoff(), log.step("a3");
      },
      [&] {
        second_thread = std::this_thread::get_id();
        log.step("b1"), handoff(), log.step("b2");
      });
  // a passes after a1 and a2; b after b1, and for good when it finishes after b2.
  EXPECT_EQ(joined(log.events), "a1 b1 a2 b2 a3");
  EXPECT_EQ(pair.handoffs(), 3);
  EXPECT_EQ(log.most_inside, 1);
  EXPECT_EQ(first_thread, std::this_thread::get_id());
  EXPECT_NE(second_thread, first_thread);
  EXPECT_GT(pair.held_seconds(0), 0.0);
  EXPECT_GT(pair.held_seconds(1), 0.0);
}

TEST(ComputePair, WithoutHandoffsThePiecesRunOneAfterTheOther) {
  ComputePair pair;
  Log log;
  pair.run([&] { log.step("a1"), log.step("a2"); }, [&] { log.step("b1"), handoff(), log.step("b2"); });
  EXPECT_EQ(joined(log.events), "a1 a2 b1 b2");  // b's handoff finds a finished: it keeps the turn
  EXPECT_EQ(pair.handoffs(), 0);
}

TEST(ComputePair, HandoffOutsideAPairReturnsAtOnce) {
  handoff();
  SUCCEED();
}

TEST(ComputePair, AnExceptionReachesTheCallerAfterTheOtherPieceFinishes) {
  ComputePair pair;
  Log log;
  EXPECT_THROW(pair.run([&] { log.step("a1"), handoff(), log.step("a2"); },
                        [&] {
                          log.step("b1");
                          throw std::runtime_error("second failed");
                        }),
               std::runtime_error);
  EXPECT_EQ(joined(log.events), "a1 b1 a2");
  // The pair is usable again.
  Log again;
  pair.run([&] { again.step("a"); }, [&] { again.step("b"); });
  EXPECT_EQ(joined(again.events), "a b");
}

TEST(ComputePair, RunsManyTimesOnOneThread) {
  ComputePair pair;
  std::thread::id worker;
  int total = 0;
  for (int i = 0; i < 200; ++i)
    pair.run([&] { ++total, handoff(), ++total; },
             [&] {
               if (i == 0) worker = std::this_thread::get_id();
               EXPECT_EQ(std::this_thread::get_id(), worker);
               ++total, handoff(), ++total;
             });
  EXPECT_EQ(total, 800);
}

}  // namespace
