#include "titan/distributed/pipeline_simulator.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "titan/core/error.h"

namespace titan::distributed::pp {

namespace {

using Key = std::pair<int, int>;  // (stage, micro-batch)

// What the ranks have produced so far, with the time each became available where it is needed.
struct Progress {
  std::map<Key, double> input;        // F(s, mb) may start: its input is on s's rank
  std::map<Key, double> output_grad;  // the backward of (s, mb) may start: its output's gradient is there
  std::map<Key, double> forward_done, input_grad_done;
  std::map<std::tuple<Op, int, int>, double> arrivals;  // (send op, stage, micro-batch) -> arrival time
};

class Replay {
 public:
  Replay(const Schedule& s, const Costs& costs) : s_(s), costs_(costs), pos_(size_t(s.ranks), 0), clock_(size_t(s.ranks), 0) {
    TITAN_CHECK(costs.stages.size() == 1 || int(costs.stages.size()) == s.stages(),
                "pipeline simulation: costs for " + std::to_string(costs.stages.size()) + " stages, the schedule has " +
                    std::to_string(s.stages()),
                "give one cost per stage, or one for all");
    bool lists_match = costs.per_action.empty() || int(costs.per_action.size()) == s.ranks;
    for (size_t r = 0; lists_match && r < costs.per_action.size(); ++r)
      lists_match = costs.per_action[r].size() == s.actions[r].size();
    TITAN_CHECK(lists_match, "pipeline simulation: per-action costs do not match " + s.name + "'s action lists",
                "give one cost per action of every rank's list, or none");
    out_.busy.assign(size_t(s.ranks), 0);
    out_.peak_in_flight.assign(size_t(s.ranks), 0);
    for (const std::vector<Action>& list : s.actions) out_.start.emplace_back(list.size(), 0.0);
    in_flight_.assign(size_t(s.ranks), 0);
  }

  Simulation run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < s_.ranks; ++r)
        while (pos_[size_t(r)] < s_.actions[size_t(r)].size() && step(r)) moved = true;
    }
    std::string stuck;
    for (int r = 0; r < s_.ranks; ++r)
      if (pos_[size_t(r)] < s_.actions[size_t(r)].size())
        stuck += " rank " + std::to_string(r) + " waits at " + action_str(s_.actions[size_t(r)][pos_[size_t(r)]]) + ";";
    TITAN_CHECK(stuck.empty(), s_.name + " (" + std::to_string(s_.ranks) + " ranks, " + std::to_string(s_.microbatches) +
                                   " micro-batches) cannot run to the end:" + stuck);
    out_.makespan = *std::max_element(clock_.begin(), clock_.end());
    const double busy = std::accumulate(out_.busy.begin(), out_.busy.end(), 0.0);
    out_.bubble_fraction = out_.makespan > 0 ? 1 - busy / (double(s_.ranks) * out_.makespan) : 0;
    return out_;
  }

 private:
  // Runs rank r's next action if what it needs is there; false when it must wait.
  bool step(int r) {
    const Action& a = s_.actions[size_t(r)][pos_[size_t(r)]];
    double& t = clock_[size_t(r)];
    const Key key{a.stage, a.microbatch};
    switch (a.op) {
      case Op::send_activation:
      case Op::send_gradient: {
        const auto& produced = a.op == Op::send_activation ? p_.forward_done : p_.input_grad_done;
        TITAN_CHECK(produced.count(key), s_.name + ": rank " + std::to_string(r) + " runs " + action_str(a) +
                                             " before computing what it sends");
        out_.start[size_t(r)][pos_[size_t(r)]] = t;
        t += costs_.send;
        p_.arrivals[{a.op, a.stage, a.microbatch}] = t + costs_.transfer;
        break;
      }
      case Op::recv_activation:
      case Op::recv_gradient: {
        const Op send = a.op == Op::recv_activation ? Op::send_activation : Op::send_gradient;
        const auto it = p_.arrivals.find({send, a.stage, a.microbatch});
        if (it == p_.arrivals.end()) return false;
        t = std::max(t, it->second);
        out_.start[size_t(r)][pos_[size_t(r)]] = t;
        if (a.op == Op::recv_activation) p_.input[{a.stage + 1, a.microbatch}] = t;
        else p_.output_grad[{a.stage - 1, a.microbatch}] = t;
        p_.arrivals.erase(it);
        break;
      }
      default:
        if (!compute(r, a, key)) return false;
    }
    ++pos_[size_t(r)];
    return true;
  }

  bool compute(int r, const Action& a, const Key& key) {
    double start = clock_[size_t(r)];
    const auto after = [&start](const std::map<Key, double>& m, const Key& k) {
      const auto it = m.find(k);
      if (it == m.end()) return false;
      start = std::max(start, it->second);
      return true;
    };
    const int last = s_.stages() - 1;
    const StageCosts& c = costs_.of(a.stage);
    double cost = 0;
    if (a.op == Op::forward) {
      if (a.stage > 0 && !after(p_.input, key)) return false;
      cost = c.forward;
    } else if (a.op == Op::backward_weight) {
      if (!after(p_.input_grad_done, key)) return false;
      cost = c.backward_weight;
    } else {
      if (!after(p_.forward_done, key) || (a.stage < last && !after(p_.output_grad, key))) return false;
      cost = a.op == Op::backward ? c.backward_input + c.backward_weight : c.backward_input;
    }
    if (!costs_.per_action.empty()) cost = costs_.per_action[size_t(r)][pos_[size_t(r)]];
    const double end = start + cost;
    out_.start[size_t(r)][pos_[size_t(r)]] = start;
    clock_[size_t(r)] = end;
    out_.busy[size_t(r)] += cost;
    int& flight = in_flight_[size_t(r)];
    if (a.op == Op::forward) {
      p_.forward_done[key] = end;
      if (a.stage < last && s_.rank_of(a.stage + 1) == r) p_.input[{a.stage + 1, a.microbatch}] = end;
      out_.peak_in_flight[size_t(r)] = std::max(out_.peak_in_flight[size_t(r)], ++flight);
    } else if (a.op != Op::backward_weight) {
      p_.input_grad_done[key] = end;
      if (a.stage > 0 && s_.rank_of(a.stage - 1) == r) p_.output_grad[{a.stage - 1, a.microbatch}] = end;
      --flight;
    }
    return true;
  }

  const Schedule& s_;
  const Costs& costs_;
  std::vector<size_t> pos_;
  std::vector<double> clock_;
  std::vector<int> in_flight_;
  Progress p_;
  Simulation out_;
};

}  // namespace

Simulation simulate(const Schedule& s, const Costs& costs) { return Replay(s, costs).run(); }

double closed_form_bubble_fraction(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank,
                                   const StageCosts& rank_stage) {
  const double p = ranks, m = microbatches, v = stages_per_rank;
  // The V schedules: two stages per rank, each half of a rank's share.
  const double f = rank_stage.forward / 2, w = rank_stage.backward_weight / 2, b = rank_stage.backward_input / 2 + w;
  const double busy = 2 * m * (f + b);
  const bool equal_costs = rank_stage.forward == rank_stage.backward_input && rank_stage.forward == rank_stage.backward_weight;
  double bubble = -1;
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return (p - 1) / (m + p - 1);
    case ScheduleKind::interleaved_1f1b: return microbatches % ranks == 0 ? (p - 1) / (v * m + p - 1) : -1;
    case ScheduleKind::dual_pipe_v:
      if (equal_costs && microbatches >= 2 * ranks) bubble = (p - 1) * ((f + b) + b - 3 * w);
      break;
    case ScheduleKind::zbv_zero_bubble:
      if (equal_costs && microbatches >= 2 * ranks - 1) bubble = (p - 1) * (f + b - 2 * w);
      break;
  }
  return bubble < 0 ? -1 : bubble / (busy + bubble);
}

}  // namespace titan::distributed::pp
