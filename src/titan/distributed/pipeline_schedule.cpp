#include "titan/distributed/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

#include "titan/core/error.h"
#include "titan/distributed/pipeline_simulator.h"

namespace titan::distributed::pp {

namespace {

// A rank's compute actions in order, before communication is added; stage counters give each
// action its micro-batch (every stage runs its micro-batches in order).
class ComputeList {
 public:
  // B and I share a counter; W follows its own (ZBVZeroBubble lists its Ws by stage).
  void add(Op op, int stage, bool overlapped = false) {
    int& next = next_[{stage, op == Op::backward ? Op::backward_input : op}];
    actions.push_back({op, stage, next++, -1, overlapped});
    if (op == Op::backward_input) owed_.push_back(actions.back());
  }
  // The oldest backward-for-weights an I left owing, if any (DualPipeV's deferred W queue).
  void add_owed_weight() {
    if (owed_.empty()) return;
    Action w = owed_.front();
    owed_.pop_front();
    w.op = Op::backward_weight;
    actions.push_back(w);
  }
  int count(int stage, Op op) const {
    const auto it = next_.find({stage, op});
    return it == next_.end() ? 0 : it->second;
  }
  std::vector<Action> actions;

 private:
  std::map<std::pair<int, Op>, int> next_;
  std::deque<Action> owed_;
};

std::vector<Action> gpipe(int r, int m) {
  ComputeList l;
  for (int i = 0; i < m; ++i) l.add(Op::forward, r);
  for (int i = 0; i < m; ++i) l.add(Op::backward, r);
  return l.actions;
}

// p - r forwards, then a backward and a forward alternately, then the remaining backwards.
std::vector<Action> one_f_one_b(int r, int p, int m) {
  ComputeList l;
  const int warmup = std::min(m, p - r);
  for (int i = 0; i < warmup; ++i) l.add(Op::forward, r);
  for (int i = warmup; i < m; ++i) {
    l.add(Op::backward, r);
    l.add(Op::forward, r);
  }
  for (int i = 0; i < warmup; ++i) l.add(Op::backward, r);
  return l.actions;
}

// PyTorch's Interleaved1F1B: micro-batches in rounds of mpr; step k's forward runs chunk
// (k / mpr) % v, the backwards visit the chunks in reverse; rank r warms up with
// (v - 1) mpr + 2 (p - 1 - r) forwards.
std::vector<Action> interleaved(int r, int p, int m, int v) {
  const int rounds = std::max(1, m / p), mpr = m / rounds, total = m * v;
  const int warmup = std::min((v - 1) * mpr + 2 * (p - 1 - r), total);
  const auto forward_stage = [&](int k) { return ((k / mpr) % v) * p + r; };
  const auto backward_stage = [&](int k) { return (v - 1 - ((k - warmup) / mpr) % v) * p + r; };
  ComputeList l;
  for (int k = 0; k < total + warmup; ++k) {
    if (k < total) l.add(Op::forward, forward_stage(k));
    if (k >= warmup) l.add(Op::backward, backward_stage(k));
  }
  return l.actions;
}

// PyTorch's ScheduleZBVZeroBubble (the zero-bubble paper's ZB-V): chunk 0 = stage r, chunk 1 =
// stage 2p - 1 - r; planned for at least 2p - 1 micro-batches, the ones beyond m then dropped.
std::vector<Action> zbv(int r, int p, int m) {
  const int n = std::max(2 * p - 1, m), s0 = r, s1 = 2 * p - 1 - r;
  ComputeList l;
  for (int i = 0; i < 2 * (p - r) - 1; ++i) l.add(Op::forward, s0);
  for (int i = 0; i < r; ++i) {
    l.add(Op::forward, s1);
    l.add(Op::forward, s0);
  }
  const auto f1_i1_w1 = [&] {
    l.add(Op::forward, s1);
    l.add(Op::backward_input, s1);
    l.add(Op::backward_weight, s1);
  };
  for (int i = 0; i < p - r; ++i) f1_i1_w1();
  while (l.count(s1, Op::forward) < l.count(s0, Op::forward) || l.count(s0, Op::forward) < n) {
    if (l.count(s0, Op::forward) < n) l.add(Op::forward, s0);
    l.add(Op::backward_input, s0);
    l.add(Op::backward_weight, s0);
    f1_i1_w1();
  }
  for (int i = 0; i < r; ++i) {
    l.add(Op::backward_input, s0);
    l.add(Op::backward_input, s1);
  }
  for (int i = 0; i < p - r; ++i) {
    l.add(Op::backward_input, s0);
    l.add(Op::backward_weight, s0);
  }
  // The rest owed, chunk 1's first (the W counters follow the I counters in stage order).
  while (l.count(s1, Op::backward_weight) < l.count(s1, Op::backward_input)) l.add(Op::backward_weight, s1);
  while (l.count(s0, Op::backward_weight) < l.count(s0, Op::backward_input)) l.add(Op::backward_weight, s0);
  std::vector<Action> kept;
  for (const Action& a : l.actions)
    if (a.microbatch < m) kept.push_back(a);
  return kept;
}

// DeepSeek's DualPipeV (dualpipev.py, as PyTorch's ScheduleDualPipeV lists it): phase 0 = stage
// r, phase 1 = stage 2p - 1 - r, in eight steps; F&B pairs overlap a forward of one phase with a
// full backward of the other; I defers its W to a queue that W steps drain in order.
std::vector<Action> dualpipev(int r, int p, int m) {
  const int s0 = r, s1 = 2 * p - 1 - r;
  ComputeList l;
  const auto forward_and_backward = [&](int f, int b) {
    l.add(Op::forward, f);
    l.add(Op::backward, b, true);
  };
  for (int i = 0; i < 2 * (p - r - 1); ++i) l.add(Op::forward, s0);  // 1
  for (int i = 0; i < r + 1; ++i) {                                    // 2
    l.add(Op::forward, s0);
    l.add(Op::forward, s1);
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 3: zero bubble
    l.add(Op::backward_input, s1);
    l.add_owed_weight();
    l.add(Op::forward, s1);
  }
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // 4: the main step
    if (i == 0 && r == p - 1) {                  // the last rank's first pair is not overlapped
      l.add(Op::forward, s0);
      l.add(Op::backward, s1);
    } else {
      forward_and_backward(s0, s1);
    }
    forward_and_backward(s1, s0);
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 5
    l.add(Op::backward, s1);
    forward_and_backward(s1, s0);
  }
  bool split = false;  // 6: the second half of the backwards defer their weights
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) split = true;
    l.add(split ? Op::backward_input : Op::backward, s1);
    if (i == (r + 1) / 2 && r % 2 == 0) split = true;
    l.add(split ? Op::backward_input : Op::backward, s0);
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 7
    l.add_owed_weight();
    l.add(Op::backward_input, s0);
  }
  for (int i = 0; i < r + 1; ++i) l.add_owed_weight();  // 8
  return l.actions;
}

// Adds the transfers around each compute slot (an action with the overlapped ones after it):
// the slot's receives first, then its compute, then its sends. A message carries the producing
// stage: SEND_F s after F s to the holder of s + 1, RECV_F s before F s + 1; SEND_B s after the
// backward (B or I) of s to the holder of s - 1, RECV_B s before the backward of s - 1.
std::vector<Action> with_transfers(const Schedule& s, int rank, const std::vector<Action>& compute) {
  std::vector<Action> out;
  const int last = s.stages() - 1;
  for (size_t i = 0; i < compute.size();) {
    size_t end = i + 1;
    while (end < compute.size() && compute[end].overlapped) ++end;
    std::vector<Action> sends;
    for (size_t j = i; j < end; ++j) {
      const Action& a = compute[j];
      if (a.op == Op::forward) {
        if (a.stage > 0 && s.rank_of(a.stage - 1) != rank)
          out.push_back({Op::recv_activation, a.stage - 1, a.microbatch, s.rank_of(a.stage - 1)});
        if (a.stage < last && s.rank_of(a.stage + 1) != rank)
          sends.push_back({Op::send_activation, a.stage, a.microbatch, s.rank_of(a.stage + 1)});
      } else if (a.op == Op::backward || a.op == Op::backward_input) {
        if (a.stage < last && s.rank_of(a.stage + 1) != rank)
          out.push_back({Op::recv_gradient, a.stage + 1, a.microbatch, s.rank_of(a.stage + 1)});
        if (a.stage > 0 && s.rank_of(a.stage - 1) != rank)
          sends.push_back({Op::send_gradient, a.stage, a.microbatch, s.rank_of(a.stage - 1)});
      }
    }
    out.insert(out.end(), compute.begin() + long(i), compute.begin() + long(end));
    out.insert(out.end(), sends.begin(), sends.end());
    i = end;
  }
  return out;
}

// Rank r's compute actions under `kind`, in the order it runs them.
std::vector<Action> compute_actions(ScheduleKind kind, int r, int p, int m, int v) {
  switch (kind) {
    case ScheduleKind::gpipe: return gpipe(r, m);
    case ScheduleKind::one_f_one_b: return one_f_one_b(r, p, m);
    case ScheduleKind::interleaved_1f1b: return interleaved(r, p, m, v);
    case ScheduleKind::zbv_zero_bubble: return zbv(r, p, m);
    case ScheduleKind::dual_pipe_v: return dualpipev(r, p, m);
  }
  return {};
}

std::string names_list() {
  std::string out;
  for (const std::string_view n : enum_name_list<ScheduleKind>()) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "B";
    case Op::backward_input: return "I";
    case Op::backward_weight: return "W";
    case Op::send_activation: return "SEND_F";
    case Op::recv_activation: return "RECV_F";
    case Op::send_gradient: return "SEND_B";
    case Op::recv_gradient: return "RECV_B";
  }
  return "?";
}

bool is_compute(Op op) {
  return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

std::string action_str(const Action& a) {
  std::string s = std::string(a.overlapped ? "&" : "") + op_name(a.op) + std::to_string(a.stage) + "." +
                  std::to_string(a.microbatch);
  if (a.op == Op::send_activation || a.op == Op::send_gradient) s += "->" + std::to_string(a.peer);
  if (a.op == Op::recv_activation || a.op == Op::recv_gradient) s += "<-" + std::to_string(a.peer);
  return s;
}

int Schedule::rank_of(int stage) const {
  if (placement == Placement::loop) return stage % ranks;
  return stage < ranks ? stage : 2 * ranks - 1 - stage;
}

std::vector<int> Schedule::stages_of(int rank) const {
  if (placement == Placement::v) return {rank, 2 * ranks - 1 - rank};
  std::vector<int> out;
  for (int c = 0; c < stages_per_rank; ++c) out.push_back(c * ranks + rank);
  return out;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const std::string_view n : enum_name_list<ScheduleKind>()) out.emplace_back(n);
  return out;
}

ScheduleKind schedule_named(std::string_view name) {
  const std::optional<ScheduleKind> kind = enum_named<ScheduleKind>(name);
  TITAN_CHECK(kind.has_value(),
              "parallelism.pipeline_parallel_schedule = \"" + std::string(name) + "\" is not a schedule of this build",
              "use one of: " + names_list());
  return *kind;
}

int default_stages_per_rank(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return 1;
    case ScheduleKind::interleaved_1f1b:
    case ScheduleKind::zbv_zero_bubble:
    case ScheduleKind::dual_pipe_v: return 2;
  }
  return 1;
}

Schedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank) {
  const std::string name(name_of(kind));
  TITAN_CHECK(ranks >= 1 && microbatches >= 1, "pipeline schedule " + name + ": " + std::to_string(ranks) + " ranks, " +
                                                   std::to_string(microbatches) + " micro-batches",
              "both must be >= 1");
  Schedule s;
  s.kind = kind;
  s.name = name;
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.stages_per_rank = stages_per_rank > 0 ? stages_per_rank : default_stages_per_rank(kind);
  const int p = ranks, m = microbatches, v = s.stages_per_rank;
  const std::string mb = std::to_string(m) + " micro-batches per step";
  const std::string fix = "raise training.local_batch_size or lower parallelism.pipeline_parallel_microbatch_size";
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b:
      TITAN_CHECK(v == 1, name + " runs one stage per rank, not " + std::to_string(v), "use Interleaved1F1B for more");
      break;
    case ScheduleKind::interleaved_1f1b:
      TITAN_CHECK(v >= 2, "Interleaved1F1B runs >= 2 stages per rank, not " + std::to_string(v), "use 1F1B for one");
      break;
    case ScheduleKind::zbv_zero_bubble:
    case ScheduleKind::dual_pipe_v:
      s.placement = Placement::v;
      TITAN_CHECK(v == 2, name + " runs exactly 2 stages per rank (the V placement), not " + std::to_string(v),
                  "set 2 stages per rank");
      break;
  }
  if (kind == ScheduleKind::one_f_one_b || kind == ScheduleKind::interleaved_1f1b)
    TITAN_CHECK(m >= p, name + " needs at least as many micro-batches as pipeline ranks (" + std::to_string(p) +
                            "), got " + mb, fix);
  if (kind == ScheduleKind::interleaved_1f1b) {
    const int rounds = std::max(1, m / p);
    TITAN_CHECK(m % rounds == 0, "Interleaved1F1B runs micro-batches in " + std::to_string(rounds) +
                                     " rounds, which do not divide " + mb,
                "use a multiple of " + std::to_string(p) + " micro-batches");
  }
  if (kind == ScheduleKind::dual_pipe_v)
    TITAN_CHECK(m >= 2 * p, "DualPipeV needs at least 2 x pipeline ranks = " + std::to_string(2 * p) +
                                " micro-batches, got " + mb, fix);
  for (int r = 0; r < p; ++r) s.actions.push_back(with_transfers(s, r, compute_actions(kind, r, p, m, v)));
  return s;
}

void check_schedule(const Schedule& s) {
  // Counts per (stage, micro-batch) of F, B, I, W, and each message's sends and receives.
  std::map<std::tuple<int, int, Op>, int> runs;
  std::map<std::tuple<Op, int, int>, int> messages;  // (send op, stage, micro-batch): sends - receives
  const auto where = [&](int r, const Action& a) { return "rank " + std::to_string(r) + "'s " + action_str(a); };
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.actions[size_t(r)]) {
      TITAN_CHECK(a.stage >= 0 && a.stage < s.stages() && a.microbatch >= 0 && a.microbatch < s.microbatches,
                  s.name + ": " + where(r, a) + " names a stage or micro-batch out of range");
      if (is_compute(a.op)) {
        TITAN_CHECK(s.rank_of(a.stage) == r, s.name + ": " + where(r, a) + " runs on a rank that does not hold the stage");
        ++runs[{a.stage, a.microbatch, a.op}];
        continue;
      }
      const bool send = a.op == Op::send_activation || a.op == Op::send_gradient;
      const Op kind = a.op == Op::recv_activation ? Op::send_activation : a.op == Op::recv_gradient ? Op::send_gradient : a.op;
      const int consumer = kind == Op::send_activation ? a.stage + 1 : a.stage - 1;
      TITAN_CHECK(consumer >= 0 && consumer < s.stages(), s.name + ": " + where(r, a) + " has no stage to go to");
      const int from = s.rank_of(a.stage), to = s.rank_of(consumer);
      TITAN_CHECK(from != to && r == (send ? from : to) && a.peer == (send ? to : from),
                  s.name + ": " + where(r, a) + " does not connect the holders of stages " + std::to_string(a.stage) +
                      " and " + std::to_string(consumer));
      messages[{kind, a.stage, a.microbatch}] += send ? 1 : -1;
    }
  }
  for (int st = 0; st < s.stages(); ++st)
    for (int mb = 0; mb < s.microbatches; ++mb) {
      const auto n = [&](Op op) { return runs.count({st, mb, op}) ? runs.at({st, mb, op}) : 0; };
      const bool whole = n(Op::backward) == 1 && n(Op::backward_input) == 0 && n(Op::backward_weight) == 0;
      const bool split = n(Op::backward) == 0 && n(Op::backward_input) == 1 && n(Op::backward_weight) == 1;
      TITAN_CHECK(n(Op::forward) == 1 && (whole || split),
                  s.name + ": stage " + std::to_string(st) + " runs micro-batch " + std::to_string(mb) + " " +
                      std::to_string(n(Op::forward)) + " F, " + std::to_string(n(Op::backward)) + " B, " +
                      std::to_string(n(Op::backward_input)) + " I, " + std::to_string(n(Op::backward_weight)) +
                      " W; wanted one F and one B (or one I and one W)");
    }
  for (const auto& [key, balance] : messages)
    TITAN_CHECK(balance == 0, s.name + ": " + std::string(op_name(std::get<0>(key))) + std::to_string(std::get<1>(key)) +
                                  "." + std::to_string(std::get<2>(key)) + " is sent " +
                                  (balance > 0 ? "without a receive" : "fewer times than received"));
  simulate(s, Costs{{StageCosts{}}, 0});  // runs to the end, every dependency met, or throws
}

std::string schedule_str(const Schedule& s) {
  std::string out;
  for (int r = 0; r < s.ranks; ++r) {
    out.append("rank ").append(std::to_string(r)).append(":");
    for (const Action& a : s.actions[size_t(r)]) out.append(" ").append(action_str(a));
    out.append("\n");
  }
  return out;
}

}  // namespace titan::distributed::pp
