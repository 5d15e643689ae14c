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
TITAN_INLINE uint32_t rank_key(float v) {
  uint32_t u = __builtin_bit_cast(uint32_t, v);
  u = u == 0x80000000u ? 0u : u;
  const uint32_t key = u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
  return v != v ? 0xffffffffu : key;
}

template <class T>
void topk_small(uint32_t* keys, int32_t* idx, const T* row, int64_t n, int64_t k) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = rank_key(to_f32(row[j]));
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

// Selects the k best entries by radix selection, writes them in index order, then sorts them by
// descending key with a stable LSD radix sort (ties keep index order). `cand` holds n keys,
// keys/idx/tmp_keys/tmp_idx hold k each.
template <class T>
void topk_radix(uint32_t* keys, int32_t* idx, uint32_t* tmp_keys, int32_t* tmp_idx, uint32_t* cand, const T* row,
                int64_t n, int64_t k) {
  uint32_t hist[2048];
  int64_t need = k;
  // Scalar math: cand = rank_key(row)
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) cand[j] = rank_key(to_f32(row[j]));
  // Digit 1: bits 31..21 over the whole row.
  for (uint32_t& h : hist) h = 0;
  for (int64_t j = 0; j < n; ++j) ++hist[cand[j] >> 21];
  const uint32_t b1 = select_bin(hist, 2048, need);
  // Digit 2: bits 20..10 over the entries sharing digit 1, compacted in place (m <= j) for digit 3.
  // Branch-free: which entries match is data-dependent, and mispredictions would dominate.
  for (uint32_t& h : hist) h = 0;
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = cand[j];
    const uint32_t match = (key >> 21) == b1;
    cand[m] = key;
    m += match;
    hist[(key >> 10) & 0x7ff] += match;
  }
  const uint32_t b2 = select_bin(hist, 2048, need);
  // Digit 3: bits 9..0 over the entries sharing digits 1 and 2.
  for (int i = 0; i < 1024; ++i) hist[i] = 0;
  for (int64_t j = 0; j < m; ++j) hist[cand[j] & 0x3ff] += ((cand[j] >> 10) & 0x7ff) == b2;
  const uint32_t b3 = select_bin(hist, 1024, need);
  const uint32_t kth = (b1 << 21) | (b2 << 10) | b3;  // the k-th best key; `need` of its copies are taken
  int64_t out = 0;
  for (int64_t j = 0; j < n && out < k; ++j) {
    const uint32_t key = rank_key(to_f32(row[j]));
    if (key > kth || (key == kth && need-- > 0)) {
      keys[out] = key;
      idx[out++] = int32_t(j);
    }
  }
  // Stable LSD radix sort, ascending in ~key (= descending key), 8 bits per pass.
  for (int shift = 0; shift < 32; shift += 8) {
    uint32_t offsets[256] = {};
    for (int64_t j = 0; j < k; ++j) ++offsets[(~keys[j] >> shift) & 0xff];
    uint32_t sum = 0;
    for (uint32_t& o : offsets) {
      const uint32_t c = o;
      o = sum;
      sum += c;
    }
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t slot = offsets[(~keys[j] >> shift) & 0xff]++;
      tmp_keys[slot] = keys[j];
      tmp_idx[slot] = idx[j];
    }
    for (int64_t j = 0; j < k; ++j) keys[j] = tmp_keys[j], idx[j] = tmp_idx[j];
  }
}

}  // namespace

template <class T>
void topk(T* values, int32_t* indices, const T* x, int64_t rows, int64_t n, int64_t k) {
  const bool small = k <= kSmallK;
  // Scratch per thread: k keys (+ k keys and indices to sort through, + n candidates for radix).
  const int64_t scratch_words = small ? k : 3 * k + n;
  parallel_for(0, rows, (1 << 15) / n + 1, [&](int64_t lo, int64_t hi) {
    const Scratch<uint32_t> buffer(scratch_words);
    uint32_t* scratch = buffer.data();
    uint32_t* keys = scratch;
    for (int64_t r = lo; r < hi; ++r) {
      const T* row = x + r * n;
      int32_t* idx = indices + r * k;
      if (small) {
        topk_small(keys, idx, row, n, k);
      } else {
        topk_radix(keys, idx, scratch + k, reinterpret_cast<int32_t*>(scratch + 2 * k), scratch + 3 * k, row, n, k);
      }
      for (int64_t j = 0; j < k; ++j) values[r * k + j] = row[idx[j]];
    }
  });
}

template void topk<float>(float*, int32_t*, const float*, int64_t, int64_t, int64_t);
template void topk<bf16>(bf16*, int32_t*, const bf16*, int64_t, int64_t, int64_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
