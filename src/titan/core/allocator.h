// Host memory with per-category accounting (live and peak bytes) and a size-keyed cache, so a
// training step that repeats the same allocations reaches a steady state with no system calls.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

enum class MemCategory : uint8_t { parameters, gradients, optimizer_state, activations, temporaries };
inline constexpr int kNumMemCategories = 5;
std::string_view mem_category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> live{};  // bytes held by tensors now
  std::array<int64_t, kNumMemCategories> peak{};  // max of live since the last reset
  int64_t live_total = 0;
  int64_t peak_total = 0;       // max of the sum (not the sum of per-category peaks)
  int64_t cached = 0;           // freed bytes kept for reuse
  int64_t system_allocs = 0;    // calls that reached the system allocator since start
};

// Alignment of every allocation: one cache line, and enough for any AVX-512 load.
inline constexpr size_t kAlignment = 64;

void* memory_alloc(size_t bytes, MemCategory category);
void memory_free(void* ptr, size_t bytes, MemCategory category);
MemoryStats memory_stats();
void memory_reset_peak();   // peak := live, per category and total
void memory_empty_cache();  // returns cached blocks to the system
// The cache is on by default and off in sanitizer builds (so ASan sees every use after free);
// TITAN_ALLOC_CACHE=0 turns it off.
bool memory_cache_enabled();
void memory_set_cache_enabled(bool on);  // turning it off also empties the cache

// ---- where the memory is: block tracking and peak snapshots ([profiling] enable_memory_snapshot)
//
// With tracking on, the allocator keeps every live block's size, category and site: the
// innermost ProfileScope (core/profiler.h) active when it was allocated, e.g. "linear.fwd".
// Turn it on before allocating what should be seen (the trainer does, at its start).
void memory_track_blocks(bool on);
bool memory_sites_enabled();

struct MemoryBlock {
  int64_t bytes = 0;
  MemCategory category = MemCategory::temporaries;
  std::string site;  // "" when allocated outside any ProfileScope
};
struct MemorySnapshot {
  int64_t peak_total = 0;           // live bytes at the peak
  std::vector<MemoryBlock> blocks;  // live at the peak, largest first
};
// Watches for the highest total of live bytes from now on; memory_snapshot_take returns the
// blocks live at that moment. Needs tracking on.
void memory_snapshot_start();
MemorySnapshot memory_snapshot_take();

}  // namespace titan
