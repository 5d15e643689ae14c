// Pipeline schedules as data: every schedule's action lists for many degrees and micro-batch
// counts pass the checker (each forward before its backward, every send received, no deadlock);
// the simulator's bubble equals the closed forms where they exist, and the zero-bubble schedules
// beat 1F1B; peak in-flight micro-batches follow each schedule's shape; bad input is refused
// with the values that would work; the checker catches broken lists.
#include <gtest/gtest.h>

#include <algorithm>

#include "titan/cli/plan_cli.h"
#include "titan/core/error.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/pipeline_simulator.h"

using namespace titan;
using namespace titan::distributed::pp;

namespace {

// F : I : W = 1 : 1 : 1 per stage (B = 2), free transfers.
Costs unit_costs() { return Costs{{StageCosts{}}, 0}; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message() + "\n" + e.hint();
  }
  return "";
}

TEST(PipelineSchedule, EveryScheduleIsValidForManyDegreesAndMicroBatchCounts) {
  int checked = 0;
  for (const auto& [kind, name] : kScheduleNames)
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 3 * p + 2; ++m)
        for (int v : {0, 3}) {
          const bool interleaved = kind == ScheduleKind::interleaved_1f1b;
          if (v == 3 && !interleaved) continue;
          if ((kind == ScheduleKind::one_f_one_b || interleaved) && m < p) continue;
          if (interleaved && m % std::max(1, m / p) != 0) continue;
          if (kind == ScheduleKind::dual_pipe_v && m < 2 * p) continue;
          SCOPED_TRACE(std::string(name) + " p " + std::to_string(p) + " m " + std::to_string(m) + " v " + std::to_string(v));
          const Schedule s = make_schedule(kind, p, m, v);
          ASSERT_NO_THROW(check_schedule(s)) << schedule_str(s);
          ++checked;
        }
  EXPECT_GT(checked, 300);
}

TEST(PipelineSchedule, GPipeAnd1F1BBubblesEqualTheClosedForm) {
  for (const ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
    for (int p : {2, 3, 4, 8})
      for (int m : {p, 2 * p, 3 * p + 1}) {
        const Simulation sim = simulate(make_schedule(kind, p, m), unit_costs());
        EXPECT_NEAR(sim.bubble_fraction, closed_form_bubble_fraction(kind, p, m, 1), 1e-12)
            << name_of(kind) << " p " << p << " m " << m;
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1)) << name_of(kind);  // (m + p - 1)(F + B)
      }
}

// Each action's start on the replay's timeline: GPipe with F = 1 runs rank r's forward of
// micro-batch k at k + r; a receive starts when its message is in, a send right after its forward.
TEST(PipelineSchedule, StartTimesFollowTheTimeline) {
  const int p = 3, m = 4;
  const Schedule s = make_schedule(ScheduleKind::gpipe, p, m);
  const Simulation sim = simulate(s, unit_costs());
  for (int r = 0; r < p; ++r) {
    ASSERT_EQ(sim.start[size_t(r)].size(), s.actions[size_t(r)].size());
    for (size_t i = 0; i < s.actions[size_t(r)].size(); ++i) {
      const Action& a = s.actions[size_t(r)][i];
      if (a.op != Op::forward && a.op != Op::recv_activation && a.op != Op::send_activation) continue;
      const double expected = a.microbatch + r + (a.op == Op::send_activation ? 1 : 0);
      EXPECT_DOUBLE_EQ(sim.start[size_t(r)][i], expected) << action_str(a);
    }
  }
}

// A replay of per-action costs equal to the stage costs gives the same timeline; doubling one
// action's cost moves the makespan; each send's hand-over delays its sender, not its compute.
TEST(PipelineSchedule, PerActionCostsReplayTheTimeline) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 4);
  Costs replay = unit_costs();
  for (int r = 0; r < 2; ++r) {
    std::vector<double> costs;
    for (const Action& a : s.actions[size_t(r)])
      costs.push_back(a.op == Op::forward ? 1 : a.op == Op::backward ? 2 : a.op == Op::backward_input || a.op == Op::backward_weight ? 1 : 0);
    replay.per_action.push_back(costs);
  }
  const Simulation same = simulate(s, replay);
  EXPECT_DOUBLE_EQ(same.makespan, simulate(s, unit_costs()).makespan);
  EXPECT_DOUBLE_EQ(same.bubble_fraction, simulate(s, unit_costs()).bubble_fraction);
  // Rank 1's (the last stage's) first backward twice as long: the whole step waits for it.
  const auto first_b = std::find_if(s.actions[1].begin(), s.actions[1].end(), [](const Action& a) { return a.op == Op::backward; });
  replay.per_action[1][size_t(first_b - s.actions[1].begin())] = 4;
  EXPECT_DOUBLE_EQ(simulate(s, replay).makespan, same.makespan + 2);
  Costs sending = unit_costs();
  sending.send = 0.5;
  const Simulation slow = simulate(s, sending);
  EXPECT_GT(slow.makespan, same.makespan);
  EXPECT_DOUBLE_EQ(slow.busy[0], same.busy[0]);  // hand-overs are not compute
  replay.per_action[0].pop_back();
  EXPECT_NE(error_of([&] { simulate(s, replay); }).find("per-action costs do not match"), std::string::npos);
}

TEST(PipelineSchedule, InterleavedBubbleShrinksByTheStagesPerRank) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        const Simulation sim = simulate(make_schedule(ScheduleKind::interleaved_1f1b, p, m, v), unit_costs());
        EXPECT_NEAR(sim.bubble_fraction, closed_form_bubble_fraction(ScheduleKind::interleaved_1f1b, p, m, v), 1e-12)
            << "p " << p << " v " << v << " m " << m;
      }
}

// The V schedules against their closed forms (DualPipe's README; ZB-H1's for ZB-V), which hold
// for F = I = W (with other costs the critical path decides: no closed form).
TEST(PipelineSchedule, VScheduleBubblesEqualTheirClosedForms) {
  EXPECT_LT(closed_form_bubble_fraction(ScheduleKind::dual_pipe_v, 2, 8, 2, StageCosts{1, 1.5, 0.7}), 0);
  for (const StageCosts rank_stage : {StageCosts{1, 1, 1}, StageCosts{0.4, 0.4, 0.4}})
    for (const ScheduleKind kind : {ScheduleKind::zbv_zero_bubble, ScheduleKind::dual_pipe_v})
      for (int p : {1, 2, 3, 4, 6})
        for (int m = 2 * p; m <= 4 * p + 1; ++m) {
          Costs chunk{{StageCosts{rank_stage.forward / 2, rank_stage.backward_input / 2, rank_stage.backward_weight / 2}}, 0};
          const Simulation sim = simulate(make_schedule(kind, p, m), chunk);
          EXPECT_NEAR(sim.bubble_fraction, closed_form_bubble_fraction(kind, p, m, 2, rank_stage), 1e-12)
              << name_of(kind) << " p " << p << " m " << m << " F " << rank_stage.forward << " I " << rank_stage.backward_input
              << " W " << rank_stage.backward_weight;
        }
}

TEST(PipelineSchedule, ZeroBubbleSchedulesBeat1F1B) {
  for (const StageCosts rank_stage : {StageCosts{1, 1, 1}, StageCosts{1, 1.5, 0.7}, StageCosts{2, 1, 1}})
  for (int p : {2, 3, 4})
    for (int m : {2 * p, 4 * p}) {
      // The V schedules hold two stages per rank, each half of a 1F1B stage's work.
      Costs half{{StageCosts{rank_stage.forward / 2, rank_stage.backward_input / 2, rank_stage.backward_weight / 2}}, 0};
      const double one_f_one_b = simulate(make_schedule(ScheduleKind::one_f_one_b, p, m), Costs{{rank_stage}, 0}).bubble_fraction;
      const double zbv = simulate(make_schedule(ScheduleKind::zbv_zero_bubble, p, m), half).bubble_fraction;
      const double dualpipev = simulate(make_schedule(ScheduleKind::dual_pipe_v, p, m), half).bubble_fraction;
      EXPECT_LT(zbv, one_f_one_b) << "p " << p << " m " << m;
      EXPECT_LT(dualpipev, one_f_one_b) << "p " << p << " m " << m;
    }
}

TEST(PipelineSchedule, PeakInFlightMicroBatchesFollowTheSchedule) {
  const int p = 4, m = 12;
  const Simulation gpipe = simulate(make_schedule(ScheduleKind::gpipe, p, m), unit_costs());
  const Simulation ofob = simulate(make_schedule(ScheduleKind::one_f_one_b, p, m), unit_costs());
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe.peak_in_flight[size_t(r)], m) << "GPipe holds every micro-batch, rank " << r;
    EXPECT_EQ(ofob.peak_in_flight[size_t(r)], p - r) << "1F1B holds p - r, rank " << r;
  }
  // DualPipeV's first rank holds two stages' worth: at most 2p + 1 stage-micro-batches.
  const Simulation dual = simulate(make_schedule(ScheduleKind::dual_pipe_v, p, m), unit_costs());
  EXPECT_LE(*std::max_element(dual.peak_in_flight.begin(), dual.peak_in_flight.end()), 2 * p + 1);
}

TEST(PipelineSchedule, TransfersConnectTheRanksOfAdjacentStages) {
  const Schedule s = make_schedule(ScheduleKind::dual_pipe_v, 2, 4);
  // Rank 1 holds stages 1 and 2: the turn of the V passes in memory, so rank 1 never sends
  // stage 1's activations.
  for (const Action& a : s.actions[1]) EXPECT_FALSE(a.op == Op::send_activation && a.stage == 1) << action_str(a);
  int overlapped = 0;
  for (const auto& rank : s.actions)
    for (const Action& a : rank) overlapped += a.overlapped;
  EXPECT_GT(overlapped, 0) << "DualPipeV pairs forwards with backwards";
  const Schedule g = make_schedule(ScheduleKind::gpipe, 3, 2);
  EXPECT_EQ(action_str(g.actions[1][0]), "RECV_F0.0<-0");
  EXPECT_EQ(action_str(g.actions[1][1]), "F1.0");
  EXPECT_EQ(action_str(g.actions[1][2]), "SEND_F1.0->2");
}

TEST(PipelineSchedule, BadInputIsRefusedWithWhatWouldWork) {
  EXPECT_NE(error_of([] { schedule_named("PipeDream"); }).find("use one of: GPipe, 1F1B"), std::string::npos);
  const std::string few = error_of([] { make_schedule(ScheduleKind::one_f_one_b, 4, 3); });
  EXPECT_NE(few.find("at least as many micro-batches as pipeline ranks (4), got 3"), std::string::npos) << few;
  const std::string dual = error_of([] { make_schedule(ScheduleKind::dual_pipe_v, 3, 5); });
  EXPECT_NE(dual.find("at least 2 x pipeline ranks = 6 micro-batches, got 5"), std::string::npos) << dual;
  const std::string rounds = error_of([] { make_schedule(ScheduleKind::interleaved_1f1b, 4, 9); });
  EXPECT_NE(rounds.find("use a multiple of 4"), std::string::npos) << rounds;
  EXPECT_NE(error_of([] { make_schedule(ScheduleKind::zbv_zero_bubble, 2, 4, 3); }).find("exactly 2 stages per rank"), std::string::npos);
}

TEST(PipelineSchedule, TheCheckerCatchesBrokenLists) {
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2);
  {  // a backward before its forward: rank 1 would wait forever
    Schedule bad = s;
    auto& r1 = bad.actions[1];
    const auto f = std::find_if(r1.begin(), r1.end(), [](const Action& a) { return a.op == Op::forward; });
    const auto b = std::find_if(r1.begin(), r1.end(), [](const Action& a) { return a.op == Op::backward; });
    std::iter_swap(f, b);
    const std::string e = error_of([&] { check_schedule(bad); });
    EXPECT_NE(e.find("cannot run to the end"), std::string::npos) << e;
  }
  {  // a send with no receive
    Schedule bad = s;
    auto& r1 = bad.actions[1];
    r1.erase(std::find_if(r1.begin(), r1.end(), [](const Action& a) { return a.op == Op::recv_activation; }));
    EXPECT_NE(error_of([&] { check_schedule(bad); }).find("without a receive"), std::string::npos);
  }
  {  // a micro-batch's backward run twice
    Schedule bad = s;
    bad.actions[0].push_back({Op::backward, 0, 1});
    EXPECT_NE(error_of([&] { check_schedule(bad); }).find("2 B"), std::string::npos);
  }
  {  // receives in an order that deadlocks: rank 0 waits for a gradient rank 1 sends after waiting on rank 0
    Schedule bad = make_schedule(ScheduleKind::gpipe, 2, 1);
    std::swap(bad.actions[0][0], bad.actions[0][2]);  // RECV_B before F0.0 and its send
    const std::string e = error_of([&] { check_schedule(bad); });
    EXPECT_NE(e.find("rank 0 waits at RECV_B1.0<-1"), std::string::npos) << e << schedule_str(bad);
  }
}

// `titan plan --pp-schedule all`: a line per schedule with the simulated and closed-form bubble.
TEST(PipelineSchedule, PlanCommandPrintsEverySchedule) {
  std::vector<std::string> words = {"plan", "--pp-schedule", "all", "--pp", "2", "--microbatches", "4"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  testing::internal::CaptureStdout();
  const int code = cli::plan_main(int(argv.size()), argv.data());
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0) << out;
  // 1F1B at p 2, m 4: bubble (p-1)/(m+p-1) = 0.2, simulated and closed form.
  EXPECT_NE(out.find("1F1B                 1     0.2000       0.2000"), std::string::npos) << out;
  for (const std::string& name : schedule_names()) EXPECT_NE(out.find("\n" + name + " "), std::string::npos) << out;
}

}  // namespace
