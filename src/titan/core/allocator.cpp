#include "titan/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "titan/core/error.h"
#include "titan/core/profiler.h"

namespace titan {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheDefault = false;
#else
constexpr bool kCacheDefault = true;
#endif

struct Block {
  int64_t bytes;
  MemCategory category;
  const char* site;  // a ProfileScope name (static storage)
};

struct Pool {
  std::mutex mu;
  MemoryStats stats;
  std::atomic<bool> track{false};  // read without the lock by memory_sites_enabled
  std::unordered_map<void*, Block> live;  // with track: every live block
  // With a snapshot open: the live blocks at its start and every allocation (+) / free (-) since.
  bool snapshot = false;
  std::unordered_map<void*, Block> at_start;
  std::vector<std::pair<void*, Block>> events;  // bytes > 0: allocated, < 0: freed
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  bool cache = [] {
    const char* env = std::getenv("TITAN_ALLOC_CACHE");
    return env ? std::string(env) != "0" : kCacheDefault;
  }();
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors may be freed during static destruction
  return *p;
}

size_t rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

std::string_view mem_category_name(MemCategory c) {
  constexpr std::string_view names[] = {"params", "grads", "optim", "activations", "temp"};
  return names[int(c)];
}

void* memory_alloc(size_t bytes, MemCategory category) {
  Pool& p = pool();
  const size_t size = rounded(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard lock(p.mu);
    auto it = p.free_blocks.find(size);
    if (it != p.free_blocks.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      p.stats.cached -= int64_t(size);
    }
  }
  if (!ptr) {
    ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr) {
      memory_empty_cache();
      ptr = std::aligned_alloc(kAlignment, size);
    }
    TITAN_CHECK(ptr, "out of host memory allocating " + std::to_string(size) + " bytes for " +
                         std::string(mem_category_name(category)),
                "reduce the batch size or sequence length, or enable activation checkpointing");
    std::lock_guard lock(p.mu);
    ++p.stats.system_allocs;
  }
  std::lock_guard lock(p.mu);
  if (p.track) {
    const Block b{int64_t(size), category, current_scope()};
    p.live[ptr] = b;
    if (p.snapshot) p.events.emplace_back(ptr, b);
  }
  MemoryStats& s = p.stats;
  const int c = int(category);
  s.live[c] += int64_t(size);
  s.live_total += int64_t(size);
  s.peak[c] = std::max(s.peak[c], s.live[c]);
  s.peak_total = std::max(s.peak_total, s.live_total);
  return ptr;
}

void memory_free(void* ptr, size_t bytes, MemCategory category) {
  if (!ptr) return;
  Pool& p = pool();
  const size_t size = rounded(bytes);
  std::lock_guard lock(p.mu);
  if (p.track) {
    auto it = p.live.find(ptr);
    if (it != p.live.end()) {
      if (p.snapshot) p.events.emplace_back(ptr, Block{-it->second.bytes, it->second.category, it->second.site});
      p.live.erase(it);
    }
  }
  p.stats.live[int(category)] -= int64_t(size);
  p.stats.live_total -= int64_t(size);
  if (p.cache) {
    p.free_blocks[size].push_back(ptr);
    p.stats.cached += int64_t(size);
  } else {
    std::free(ptr);
  }
}

MemoryStats memory_stats() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  return p.stats;
}

void memory_reset_peak() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  p.stats.peak = p.stats.live;
  p.stats.peak_total = p.stats.live_total;
}

void memory_empty_cache() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  for (auto& [size, blocks] : p.free_blocks)
    for (void* b : blocks) std::free(b);
  p.free_blocks.clear();
  p.stats.cached = 0;
}

bool memory_cache_enabled() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  return p.cache;
}

void memory_set_cache_enabled(bool on) {
  {
    Pool& p = pool();
    std::lock_guard lock(p.mu);
    p.cache = on;
  }
  if (!on) memory_empty_cache();
}

void memory_track_blocks(bool on) {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  p.track = on;
  if (!on) p.live.clear(), p.snapshot = false;
}

bool memory_sites_enabled() { return pool().track.load(std::memory_order_relaxed); }

void memory_snapshot_start() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  TITAN_CHECK(p.track, "memory_snapshot_start() without block tracking", "call memory_track_blocks(true) first");
  p.snapshot = true;
  p.at_start = p.live;
  p.events.clear();
}

MemorySnapshot memory_snapshot_take() {
  Pool& p = pool();
  std::unordered_map<void*, Block> live;
  std::vector<std::pair<void*, Block>> events;
  {
    std::lock_guard lock(p.mu);
    TITAN_CHECK(p.snapshot, "memory_snapshot_take() without memory_snapshot_start()");
    p.snapshot = false;
    live.swap(p.at_start);
    events.swap(p.events);
  }
  // The moment of the peak, then the blocks live at it.
  int64_t total = 0, peak = 0;
  size_t peak_at = 0;  // events applied at the peak
  for (const auto& [ptr, b] : live) total += b.bytes;
  peak = total;
  for (size_t i = 0; i < events.size(); ++i) {
    total += events[i].second.bytes;
    if (total > peak) peak = total, peak_at = i + 1;
  }
  for (size_t i = 0; i < peak_at; ++i) {
    const auto& [ptr, b] = events[i];
    if (b.bytes > 0) live[ptr] = b;
    else live.erase(ptr);
  }
  MemorySnapshot out;
  out.peak_total = peak;
  for (const auto& [ptr, b] : live) out.blocks.push_back({b.bytes, b.category, b.site ? b.site : ""});
  std::sort(out.blocks.begin(), out.blocks.end(), [](const MemoryBlock& a, const MemoryBlock& b) { return a.bytes > b.bytes; });
  return out;
}

}  // namespace titan
