#include "titan/kernels/cpu/topk.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Up to this k, a sorted buffer beats radix selection (each entry costs one compare with the
// current k-th best; inserts are rare once the buffer holds good values).
constexpr int64_t kSmallK = 32;

// A uint32 that orders like the ranking in ref/topk.h: NaN highest, -0 == +0, then IEEE order
// (sign set: flip all bits; sign clear: set the sign bit). Branch-free, so key loops vectorize.
// Integer operations only, so GCC vectorizes it under the default -ftrapping-math.
TITAN_INLINE uint32_t rank_key(float v) {
  uint32_t u = __builtin_bit_cast(uint32_t, v);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0u : u;
  const uint32_t key = u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
  return nan ? 0xffffffffu : key;
}

template <class T>
TITAN_INLINE void row_keys(uint32_t* keys, const T* row, int64_t n) {
  // Scalar math: keys = rank_key(row)
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) keys[j] = rank_key(to_f32(row[j]));
}

// keys: [k] best keys so far, descending; idx: [k] their indices; all: [n] the row's keys.
void topk_small(uint32_t* keys, int32_t* idx, const uint32_t* all, int64_t n, int64_t k) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = all[j];
    if (count == k && key <= keys[k - 1]) continue;  // ties lose to the earlier (lower) index
    int64_t pos = count < k ? count++ : k - 1;
    while (pos > 0 && keys[pos - 1] < key) {
      keys[pos] = keys[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    keys[pos] = key;
    idx[pos] = int32_t(j);
  }
}

// The bin holding the need-th largest element (need >= 1) in a histogram scanned from the top;
// returns the bin and reduces `need` to the rank within it.
TITAN_INLINE uint32_t select_bin(const uint32_t* hist, int bins, int64_t& need) {
  int b = bins - 1;
  for (; b > 0 && hist[b] < uint64_t(need); --b) need -= hist[b];
  return uint32_t(b);
}

// Scratch of the radix path, carved from one buffer of radix_scratch_words(n, k) words.
struct RadixScratch {
  uint32_t* keys;      // [k + 1] selected keys (one spare slot for branch-free appends)
  int32_t* idx;        // [k + 1] their indices
  uint32_t* tmp_keys;  // [k] sort ping-pong
  int32_t* tmp_idx;    // [k]
  uint32_t* all;       // [n] the row's keys
  uint32_t* cand;      // [n] keys sharing the selected leading digits
};
int64_t radix_scratch_words(int64_t n, int64_t k) { return 4 * k + 2 + 2 * n; }
RadixScratch carve(uint32_t* p, int64_t n, int64_t k) {
  RadixScratch s;
  s.keys = p;
  s.idx = reinterpret_cast<int32_t*>(p + k + 1);
  s.tmp_keys = p + 2 * (k + 1);
  s.tmp_idx = reinterpret_cast<int32_t*>(s.tmp_keys + k);
  s.all = s.tmp_keys + 2 * k;
  s.cand = s.all + n;
  return s;
}

// Selects the k best of the row's keys (s.all) by radix selection on 11/11/10-bit digits, in
// index order, then sorts them by descending key with a stable LSD radix sort (ties keep index
// order). Leaves the result in s.keys / s.idx.
void topk_radix(const RadixScratch& s, int64_t n, int64_t k) {
  uint32_t hist[2048];
  int64_t need = k;
  // Digit 1: bits 31..21 over the whole row.
  for (uint32_t& h : hist) h = 0;
  for (int64_t j = 0; j < n; ++j) ++hist[s.all[j] >> 21];
  const uint32_t b1 = select_bin(hist, 2048, need);
  // Digit 2: bits 20..10 over the entries sharing digit 1, compacted into cand for digit 3.
  // Branch-free: which entries match is data-dependent, and mispredictions would dominate.
  for (uint32_t& h : hist) h = 0;
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = s.all[j];
    const uint32_t match = (key >> 21) == b1;
    s.cand[m] = key;
    m += match;
    hist[(key >> 10) & 0x7ff] += match;
  }
  const uint32_t b2 = select_bin(hist, 2048, need);
  // Digit 3: bits 9..0 over the entries sharing digits 1 and 2.
  for (int i = 0; i < 1024; ++i) hist[i] = 0;
  for (int64_t j = 0; j < m; ++j) hist[s.cand[j] & 0x3ff] += ((s.cand[j] >> 10) & 0x7ff) == b2;
  const uint32_t b3 = select_bin(hist, 1024, need);
  const uint32_t kth = (b1 << 21) | (b2 << 10) | b3;  // the k-th best key; `need` of its copies are taken
  // Everything above kth, and the first `need` copies of kth, in index order. Branch-free
  // appends: every entry is written at `out`, which only advances for taken ones (slot k is spare).
  int64_t out = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = s.all[j];
    const bool equal = key == kth;
    const bool take = key > kth || (equal && need > 0);
    need -= equal && take;
    s.keys[out] = key;
    s.idx[out] = int32_t(j);
    out += take;
  }
  // Stable LSD radix sort, ascending in ~key (= descending key), 8 bits per pass; a pass where
  // every key has the same digit is skipped (bf16 scores have 16 zero low bits).
  for (int shift = 0; shift < 32; shift += 8) {
    uint32_t offsets[256] = {};
    for (int64_t j = 0; j < k; ++j) ++offsets[(~s.keys[j] >> shift) & 0xff];
    if (offsets[(~s.keys[0] >> shift) & 0xff] == uint32_t(k)) continue;
    uint32_t sum = 0;
    for (uint32_t& o : offsets) {
      const uint32_t c = o;
      o = sum;
      sum += c;
    }
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t slot = offsets[(~s.keys[j] >> shift) & 0xff]++;
      s.tmp_keys[slot] = s.keys[j];
      s.tmp_idx[slot] = s.idx[j];
    }
    for (int64_t j = 0; j < k; ++j) s.keys[j] = s.tmp_keys[j], s.idx[j] = s.tmp_idx[j];
  }
}

}  // namespace

template <class T>
void topk(T* values, int32_t* indices, const T* x, int64_t rows, int64_t n, int64_t k) {
  const bool small = k <= kSmallK;
  const int64_t words = small ? k + n : radix_scratch_words(n, k);  // per thread
  parallel_for(0, rows, (1 << 15) / n + 1, [&](int64_t lo, int64_t hi) {
    const Scratch<uint32_t> buffer(words);
    for (int64_t r = lo; r < hi; ++r) {
      const T* row = x + r * n;
      int32_t* idx = indices + r * k;
      if (small) {
        uint32_t* all = buffer.data() + k;
        row_keys(all, row, n);
        topk_small(buffer.data(), idx, all, n, k);
      } else {
        const RadixScratch s = carve(buffer.data(), n, k);
        row_keys(s.all, row, n);
        topk_radix(s, n, k);
        for (int64_t j = 0; j < k; ++j) idx[j] = s.idx[j];
      }
      for (int64_t j = 0; j < k; ++j) values[r * k + j] = row[idx[j]];
    }
  });
}

template void topk<float>(float*, int32_t*, const float*, int64_t, int64_t, int64_t);
template void topk<bf16>(bf16*, int32_t*, const bf16*, int64_t, int64_t, int64_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
