#include "titan/core/clock.h"
#include "titan/distributed/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"

namespace titan::distributed {

namespace fs = std::filesystem;
using nlohmann::json;

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::scheduled: return "scheduled";
    case OpState::started: return "started";
    case OpState::completed: return "completed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)), epoch_(steady_seconds()) {}

void FlightRecorder::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = std::max<size_t>(capacity, 1);
  ring_.clear();
  next_id_ = 0;
}

double FlightRecorder::now() const { return steady_seconds() - epoch_; }

int FlightRecorder::add_group(const std::string& name, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back({name, ranks});
  last_seq_.push_back(0);
  last_p2p_seq_.emplace_back();
  return int(groups_.size()) - 1;
}

uint64_t FlightRecorder::record(FlightEntry e) {
  std::lock_guard<std::mutex> lock(mu_);
  e.record_id = next_id_++;
  if (e.group >= 0 && size_t(e.group) < last_seq_.size()) {
    if (e.tag < 0) last_seq_[size_t(e.group)] = e.seq;
    else last_p2p_seq_[size_t(e.group)][fmt::format("{} tag {}", e.op, e.tag)] = e.seq;
  }
  if (ring_.size() < capacity_) ring_.push_back(std::move(e));
  else ring_[e.record_id % capacity_] = std::move(e);
  return next_id_ - 1;
}

void FlightRecorder::set_state(uint64_t id, OpState state, double time) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id + capacity_ < next_id_ || ring_.empty()) return;  // fell off the ring
  FlightEntry& e = ring_[id % capacity_];
  if (e.record_id != id) return;
  e.state = state;
  (state == OpState::started ? e.started : e.completed) = time;
}

std::vector<uint64_t> FlightRecorder::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

std::vector<std::map<std::string, uint64_t>> FlightRecorder::last_p2p_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_p2p_seq_;
}

json FlightRecorder::dump(int rank, int world_size, const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  json groups = json::array();
  for (const GroupInfo& g : groups_) groups.push_back({{"name", g.name}, {"ranks", g.ranks}});
  std::vector<const FlightEntry*> order;
  for (const FlightEntry& e : ring_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->record_id < b->record_id; });
  json entries = json::array();
  for (const FlightEntry* e : order) {
    entries.push_back({{"record_id", e->record_id}, {"group", groups_.at(size_t(e->group)).name},
                       {"seq", e->seq}, {"op", e->op}, {"dtype", e->dtype}, {"in_elems", e->in_elems},
                       {"out_elems", e->out_elems}, {"state", op_state_name(e->state)},
                       {"enqueued_s", e->enqueued}, {"started_s", e->started}, {"completed_s", e->completed}});
    if (e->tag >= 0) entries.back()["tag"] = e->tag;
  }
  return {{"format", "titan-flight-recorder"}, {"version", 1}, {"rank", rank}, {"world_size", world_size},
          {"reason", reason}, {"groups", groups}, {"entries", entries}};
}

fs::path flight_dump_path(const fs::path& folder, int rank) { return folder / fmt::format("rank{}.json", rank); }

// ---- analysis ---------------------------------------------------------------------------------

namespace {

struct RankDump {
  int rank = 0;
  std::string reason;
  std::map<std::string, std::vector<int>> groups;         // name -> world ranks
  std::map<std::string, std::map<uint64_t, json>> entries;  // group -> seq -> entry (collectives)
  // group -> channel ("0->1 tag 3", group ranks) -> seq -> entry (this rank's sends or receives on it)
  std::map<std::string, std::map<std::string, std::map<uint64_t, json>>> p2p;
};

std::string describe(const json& e) {
  return fmt::format("#{} {} ({}, {} -> {} elements, {})", e.at("seq").get<uint64_t>(), e.at("op").get<std::string>(),
                     e.at("dtype").get<std::string>(), e.at("in_elems").get<int64_t>(),
                     e.at("out_elems").get<int64_t>(), e.at("state").get<std::string>());
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// A point-to-point channel's report line: its first transfer one side never posted, or posted with
// another size or dtype, or that did not complete; empty when the two sides agree. `channel` is
// "S->R tag T" in group ranks; its sends are in S's dump, its receives in R's.
std::string analyze_channel(const std::string& group, const std::string& channel, const std::vector<int>& members,
                            const std::map<int, RankDump>& dumps) {
  int src = -1, dst = -1, tag = 0;
  if (std::sscanf(channel.c_str(), "%d->%d tag %d", &src, &dst, &tag) != 3 || src < 0 || dst < 0 ||
      size_t(src) >= members.size() || size_t(dst) >= members.size())
    return {};
  const int sender = members[size_t(src)], receiver = members[size_t(dst)];
  const auto side = [&](int rank) -> const std::map<uint64_t, json>* {
    auto d = dumps.find(rank);
    if (d == dumps.end()) return nullptr;
    auto g = d->second.p2p.find(group);
    if (g == d->second.p2p.end()) return nullptr;
    auto c = g->second.find(channel);
    return c == g->second.end() ? nullptr : &c->second;
  };
  const auto* sends = side(sender);
  const auto* recvs = side(receiver);
  if (!dumps.count(sender) || !dumps.count(receiver)) return {};  // the group's line names the missing dump
  uint64_t first = 1, last = 0;
  for (const auto* s : {sends, recvs})
    if (s && !s->empty()) first = std::max(first, s->begin()->first), last = std::max(last, s->rbegin()->first);
  const auto last_of = [](const std::map<uint64_t, json>* s) {
    return !s || s->empty() ? std::string("none") : describe(s->rbegin()->second);
  };
  for (uint64_t q = first; q <= last; ++q) {
    const json* snd = nullptr;
    const json* rcv = nullptr;
    if (sends)
      if (auto it = sends->find(q); it != sends->end()) snd = &it->second;
    if (recvs)
      if (auto it = recvs->find(q); it != recvs->end()) rcv = &it->second;
    if (!snd && !rcv) continue;  // fell off both rings
    const std::string head = fmt::format("group {}: transfer {} #{}: ", group, channel, q);
    if (!snd)
      return head + fmt::format("rank {} never posted the send that rank {}'s {} waits for; rank {}'s last send on "
                                "the channel is {}\n",
                                sender, receiver, describe(*rcv), sender, last_of(sends));
    if (!rcv)
      return head + fmt::format("rank {} never posted the receive of rank {}'s {}; rank {}'s last receive on the "
                                "channel is {}\n",
                                receiver, sender, describe(*snd), receiver, last_of(recvs));
    if ((*snd)["dtype"] != (*rcv)["dtype"] || (*snd)["in_elems"] != (*rcv)["out_elems"])
      return head + fmt::format("rank {} sends {} but rank {} receives {}\n", sender, describe(*snd), receiver,
                                describe(*rcv));
    if ((*snd)["state"] != "completed" || (*rcv)["state"] != "completed")
      return head + fmt::format("posted on both sides but not completed: rank {} {}, rank {} {}\n", sender,
                                describe(*snd), receiver, describe(*rcv));
  }
  return {};
}

// The report lines for one group: its first divergence, or that its ranks agree.
std::string analyze_group(const std::string& name, const std::vector<int>& members, const std::map<int, RankDump>& dumps) {
  std::vector<int> missing_dumps;
  uint64_t first = 1, last = 0;
  for (int r : members) {
    auto d = dumps.find(r);
    if (d == dumps.end()) {
      missing_dumps.push_back(r);
      continue;
    }
    auto g = d->second.entries.find(name);
    if (g == d->second.entries.end() || g->second.empty()) continue;
    first = std::max(first, g->second.begin()->first);  // older ones may have fallen off the ring
    last = std::max(last, g->second.rbegin()->first);
  }
  std::string head = "group " + name + ": ";
  if (!missing_dumps.empty()) head += fmt::format("no dump from rank(s) {} (dead or hung before dumping); ", rank_list(missing_dumps));
  for (uint64_t s = first; s <= last; ++s) {
    std::vector<int> absent, pending;
    const json* ref = nullptr;
    int ref_rank = -1;
    std::string mismatch;
    for (int r : members) {
      auto d = dumps.find(r);
      if (d == dumps.end()) continue;
      auto g = d->second.entries.find(name);
      const json* e = nullptr;
      if (g != d->second.entries.end())
        if (auto it = g->second.find(s); it != g->second.end()) e = &it->second;
      if (!e) {
        absent.push_back(r);
        continue;
      }
      if (e->at("state") != "completed") pending.push_back(r);
      if (!ref) {
        ref = e, ref_rank = r;
      } else if (mismatch.empty() && ((*e)["op"] != (*ref)["op"] || (*e)["dtype"] != (*ref)["dtype"] ||
                                      (*e)["in_elems"] != (*ref)["in_elems"] || (*e)["out_elems"] != (*ref)["out_elems"])) {
        mismatch = fmt::format("rank {} has {} where rank {} has {}", r, describe(*e), ref_rank, describe(*ref));
      }
    }
    if (!mismatch.empty()) return head + "collective #" + std::to_string(s) + " differs: " + mismatch + "\n";
    if (!absent.empty() && ref) {
      std::string last_of;
      for (int r : absent) {
        const auto& g = dumps.at(r).entries;
        auto it = g.find(name);
        last_of += fmt::format("; rank {}'s last is {}", r,
                               it == g.end() || it->second.empty() ? std::string("none") : describe(it->second.rbegin()->second));
      }
      return head + fmt::format("rank(s) {} never reached {} that rank(s) {} entered{}\n", rank_list(absent),
                                describe(*ref), rank_list(pending.empty() ? std::vector<int>{ref_rank} : pending), last_of);
    }
    if (!pending.empty())
      return head + fmt::format("{} did not complete on rank(s) {} (every rank entered it)\n", describe(*ref),
                                rank_list(pending));
  }
  if (last == 0) return head + "no collectives recorded\n";
  return head + fmt::format("ranks agree on collectives #{}..#{}, all completed\n", first, last);
}

// The report lines of a group's point-to-point channels: each divergent one, or how many agree.
std::string analyze_p2p(const std::string& name, const std::vector<int>& members, const std::map<int, RankDump>& dumps) {
  std::set<std::string> channels;
  for (int r : members)
    if (auto d = dumps.find(r); d != dumps.end())
      if (auto g = d->second.p2p.find(name); g != d->second.p2p.end())
        for (const auto& [channel, entries] : g->second) channels.insert(channel);
  if (channels.empty()) return {};
  std::string out;
  for (const std::string& channel : channels) out += analyze_channel(name, channel, members, dumps);
  if (out.empty())
    out = fmt::format("group {}: point-to-point transfers agree on {} channel(s) (sender->receiver tag), all completed\n",
                      name, channels.size());
  return out;
}

}  // namespace

std::string analyze_flight_dumps(const fs::path& folder) {
  TITAN_CHECK(fs::is_directory(folder), "flight-recorder folder " + folder.string() + " does not exist",
              "pass the folder the watchdog named (<job.dump_folder>/<comm.save_traces_folder>)");
  std::map<int, RankDump> dumps;
  int world = 0;
  for (const auto& f : fs::directory_iterator(folder)) {
    const std::string n = f.path().filename().string();
    if (!n.starts_with("rank") || f.path().extension() != ".json") continue;
    json j;
    try {
      j = json::parse(std::ifstream(f.path()));
    } catch (const json::exception& e) {
      TITAN_FAIL(f.path().string() + " is not valid JSON: " + e.what(), "the dump was cut short; analyze the others");
    }
    TITAN_CHECK(j.value("format", "") == "titan-flight-recorder", f.path().string() + " is not a flight-recorder dump");
    RankDump d;
    d.rank = j.at("rank").get<int>();
    d.reason = j.value("reason", "");
    world = std::max(world, j.at("world_size").get<int>());
    // A group is its name and members: the two dp_shard groups of HSDP 2 x 2 share a name.
    std::map<std::string, std::string> key_of;
    for (const auto& g : j.at("groups")) {
      const auto ranks = g.at("ranks").get<std::vector<int>>();
      const std::string key = g.at("name").get<std::string>() + " [" + rank_list(ranks) + "]";
      key_of[g.at("name").get<std::string>()] = key;
      d.groups[key] = ranks;
    }
    for (const auto& e : j.at("entries")) {
      const std::string& group = key_of.at(e.at("group").get<std::string>());
      const uint64_t seq = e.at("seq").get<uint64_t>();
      if (!e.contains("tag")) {
        d.entries[group][seq] = e;
        continue;
      }
      // "send 0->1" -> channel "0->1 tag T"
      const std::string op = e.at("op").get<std::string>();
      const std::string channel = op.substr(op.find(' ') + 1) + " tag " + std::to_string(e.at("tag").get<int>());
      d.p2p[group][channel][seq] = e;
    }
    dumps[d.rank] = std::move(d);
  }
  TITAN_CHECK(!dumps.empty(), folder.string() + " holds no rank*.json dump",
              "the watchdog writes one per rank when a collective times out");
  std::string out = fmt::format("flight recorder: {} of {} ranks dumped ({})\n", dumps.size(), world, folder.string());
  for (const auto& [r, d] : dumps)
    if (!d.reason.empty()) out += fmt::format("rank {}: {}\n", r, d.reason);
  // Every group any rank knows, identified by name and members.
  std::map<std::string, std::vector<int>> groups;
  for (const auto& [r, d] : dumps)
    for (const auto& [name, ranks] : d.groups) groups.emplace(name, ranks);
  for (const auto& [name, ranks] : groups) out += analyze_group(name, ranks, dumps) + analyze_p2p(name, ranks, dumps);
  return out;
}

}  // namespace titan::distributed
