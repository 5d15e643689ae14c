// The flight recorder: a ring of the last N collectives this process enqueued (PyTorch's
// c10d FlightRecorder, recorded by our communication thread), dumped as JSON when the watchdog
// fires, and the analysis `titan fr analyze DIR` runs over every rank's dump: walk each group's
// collectives by sequence id, match them across the group's ranks, and report the first one
// some rank never reached, or reached with another op, size or dtype. Point-to-point transfers
// are matched per channel (sender, receiver, tag): the n-th send with the n-th receive.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace titan::distributed {

enum class OpState : uint8_t { scheduled, started, completed };
const char* op_state_name(OpState s);

struct FlightEntry {
  uint64_t record_id = 0;   // position in this process's stream of collectives
  int group = 0;            // index into the recorder's group table
  uint64_t seq = 0;         // the group's collective sequence id (1, 2, ...), the same on every member;
                            // for a transfer, its channel's (the same on the sender and the receiver)
  std::string op;           // "all_gather", "send 0->1" (group ranks: sender->receiver), ...
  int tag = -1;             // a transfer's tag; -1 for a collective
  std::string dtype;        // "f32", "bf16", ...
  int64_t in_elems = 0, out_elems = 0;
  OpState state = OpState::scheduled;
  double enqueued = 0, started = 0, completed = 0;  // seconds since the recorder's epoch; 0: not yet
};

struct GroupInfo {
  std::string name;
  std::vector<int> ranks;  // world ranks, in group-rank order
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 20000);
  // Registers a group; returns its index (used in entries).
  int add_group(const std::string& name, const std::vector<int>& ranks);
  // Appends an entry (the oldest falls off a full ring); returns its record id.
  uint64_t record(FlightEntry entry);
  void set_state(uint64_t record_id, OpState state, double time);
  // Seconds since this recorder was created (the time base of every entry).
  double now() const;
  // The last sequence id enqueued on each group (0 when none), indexed like the group table.
  std::vector<uint64_t> last_seq() const;
  // Per group (indexed the same), the last sequence id of each point-to-point channel this process
  // used, keyed "send 0->1 tag 3" / "recv 0->1 tag 3".
  std::vector<std::map<std::string, uint64_t>> last_p2p_seq() const;
  const std::vector<GroupInfo>& groups() const { return groups_; }
  // {"rank", "world_size", "reason", "groups": [...], "entries": [...]} with every entry held.
  nlohmann::json dump(int rank, int world_size, const std::string& reason) const;
  void set_capacity(size_t capacity);

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::vector<FlightEntry> ring_;  // ring_[record_id % capacity_]
  uint64_t next_id_ = 0;
  std::vector<GroupInfo> groups_;
  std::vector<uint64_t> last_seq_;
  std::vector<std::map<std::string, uint64_t>> last_p2p_seq_;
  double epoch_;
};

// The dump file of rank r in a traces folder.
std::filesystem::path flight_dump_path(const std::filesystem::path& folder, int rank);

// Reads every rank*.json of `folder` and returns a human-readable report: per group, the first
// collective where the ranks diverge (ranks that never reached it, or a different op, size or
// dtype), or that they agree. Throws naming the folder when it holds no dump.
std::string analyze_flight_dumps(const std::filesystem::path& folder);

}  // namespace titan::distributed
