// Pipeline-parallel schedules as data (TorchTitan / PyTorch pipelining; DeepSeek's DualPipeV):
// each pipeline rank runs a list of actions in order, so that one executor runs every schedule
// and one checker and one simulator (pipeline_simulator.h) reason about all of them.
//
// Compute actions name a stage (global index, 0 = embeddings ... S - 1 = norm, output, loss) and
// a micro-batch: F (forward), B (full backward), I (backward for the inputs) and W (backward for
// the weights): the zero-bubble split, I then W doing what B does. An action `overlapped` runs
// together with the compute action before it (DualPipeV's F&B pairs: one micro-batch's forward and
// another's backward, so that each one's communication hides under the other's compute).
// Communication actions (added by make_schedule) move a micro-batch's activation forward or its
// gradient backward between the ranks holding adjacent stages; a stage next to one on the same
// rank (the V placement's turn) passes it in memory.
// Stage placement: "loop" (rank r holds stages r, r + p, ...; GPipe, 1F1B, Interleaved1F1B) or
// "v" (rank r holds stages r and 2p - 1 - r; ZBVZeroBubble, DualPipeV).
// Sources and closed forms: shared/reference/distributed.md section 6, docs/distributed.md.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/enum_names.h"

namespace titan::distributed::pp {

// The schedules, named as TorchTitan names them (what [parallelism] pipeline_parallel_schedule
// and `titan plan --pp-schedule` accept).
enum class ScheduleKind { gpipe, one_f_one_b, interleaved_1f1b, zbv_zero_bubble, dual_pipe_v };
inline constexpr std::array<EnumName<ScheduleKind>, 5> kScheduleNames = {{
    {ScheduleKind::gpipe, "GPipe"},
    {ScheduleKind::one_f_one_b, "1F1B"},
    {ScheduleKind::interleaved_1f1b, "Interleaved1F1B"},
    {ScheduleKind::zbv_zero_bubble, "ZBVZeroBubble"},
    {ScheduleKind::dual_pipe_v, "DualPipeV"},
}};
constexpr std::span<const EnumName<ScheduleKind>> enum_names(ScheduleKind) { return kScheduleNames; }

enum class Op { forward, backward, backward_input, backward_weight, send_activation, recv_activation,
                send_gradient, recv_gradient };
const char* op_name(Op op);  // "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"
bool is_compute(Op op);

struct Action {
  Op op;
  int stage = 0;
  int microbatch = 0;
  int peer = -1;             // communication: the other rank
  bool overlapped = false;   // compute: runs together with the compute action before it
};
std::string action_str(const Action& a);  // e.g. "F3.1" (stage 3, micro-batch 1), "SEND_F3.1->2"

enum class Placement { loop, v };

struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  std::string name;  // name_of(kind), for messages
  int ranks = 1, microbatches = 1, stages_per_rank = 1;
  Placement placement = Placement::loop;
  std::vector<std::vector<Action>> actions;  // per rank, in the order it runs them

  int stages() const { return ranks * stages_per_rank; }
  int rank_of(int stage) const;
  std::vector<int> stages_of(int rank) const;  // in local order (chunk 0, 1, ...)
};

// The schedules by their TorchTitan names: GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV.
std::vector<std::string> schedule_names();
// The schedule a command line names; throws, listing the names, on an unknown one.
ScheduleKind schedule_named(std::string_view name);
// The stages per rank a schedule runs (1, or 2 for the V schedules); for Interleaved1F1B the
// caller's choice (>= 2), given here as its default.
int default_stages_per_rank(ScheduleKind kind);

// The action lists of `kind` for `ranks` pipeline ranks and `microbatches` micro-batches per step
// (stages_per_rank 0: the default). Throws, naming the key and the values that would work, on
// too few micro-batches (1F1B and Interleaved1F1B need >= ranks, DualPipeV >= 2 x ranks), or
// micro-batches Interleaved1F1B cannot group in rounds.
Schedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank = 0);

// Checks what every generated list must satisfy, throwing with the first violation: every stage
// runs each micro-batch's forward once and its backward once (B, or I then W), on the rank that
// holds the stage, after the forward it depends on; each send has its receive on the peer; and the
// lists run to the end when sends are buffered and receives wait (no deadlock).
void check_schedule(const Schedule& s);

// One line per rank, e.g. "rank 0: F0.0 SEND_F0.0->1 F0.1 ...".
std::string schedule_str(const Schedule& s);

}  // namespace titan::distributed::pp
