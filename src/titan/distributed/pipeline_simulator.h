// Replays a pipeline schedule's action lists (pipeline_schedule.h) with a cost per compute action
// and per transfer, as the ranks would run them: each rank in its order, a receive waiting for its
// send plus the transfer time, sends not waiting (beyond the sender's own hand-over time), an
// overlapped action after its partner. Gives the
// step's makespan, each rank's busy time, the bubble fraction and the peak number of micro-batches
// in flight (forward done, backward for inputs not yet) per rank; throws when the lists cannot run
// to the end (a deadlock or a dependency a rank never receives), naming what each rank waits for.
#pragma once

#include <vector>

#include "titan/distributed/pipeline_schedule.h"

namespace titan::distributed::pp {

// Seconds (or any unit) of one micro-batch's actions on a stage. B = I + W.
struct StageCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
};

struct Costs {
  std::vector<StageCosts> stages;  // one per stage, or one for every stage
  double transfer = 0;             // one activation or gradient between ranks
  double send = 0;                 // the sender's own time to hand one over (not compute: not busy)
  // Optional, a replay of measured times: per rank, per action of its list, each compute action's
  // own cost (the others' ignored). Empty: every action costs its stage's.
  std::vector<std::vector<double>> per_action = {};
  const StageCosts& of(int stage) const { return stages.size() == 1 ? stages[0] : stages.at(size_t(stage)); }
};

struct Simulation {
  double makespan = 0;
  std::vector<double> busy;          // per rank: time spent in compute actions
  std::vector<int> peak_in_flight;   // per rank
  std::vector<std::vector<double>> start;  // per rank, per action of its list: when it began
  double bubble_fraction = 0;        // 1 - sum(busy) / (ranks x makespan)
};

Simulation simulate(const Schedule& s, const Costs& costs);

// The closed-form bubble fraction (distributed.md section 6) with free transfers and every stage
// costing `rank_stage` / v (rank_stage: one rank's share of the model, as 1F1B splits it; F, B =
// I + W and W of a stage below): GPipe and 1F1B (p-1)/(m+p-1); Interleaved1F1B with m a multiple
// of p, (p-1)/(v m + p-1); DualPipeV a bubble of (p-1)(F&B + B - 3W) per rank (DualPipe's README,
// with F&B = F + B: on a CPU the pair's compute does not overlap, only its transfers would);
// ZBVZeroBubble (p-1)(F + B - 2W), the zero-bubble paper's ZB-H1 bubble (m >= 2p - 1); both
// for F = I = W, their papers' assumption (otherwise the critical path decides; < 0 here). Else < 0.
double closed_form_bubble_fraction(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank,
                                   const StageCosts& rank_stage = {});

}  // namespace titan::distributed::pp
