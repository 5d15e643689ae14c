#include "titan/kernels/onednn/matmul.h"

#include <omp.h>

#include <bit>
#include <memory>
#include <mutex>
#include <string_view>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/error.h"

namespace titan::kernels::onednn {
namespace {

using dt = dnnl::memory::data_type;

// Everything a primitive depends on. Pointers are not part of it: they are set per call.
struct Key {
  int64_t batch, m, n, k, lda, ldb, ldc, batch_stride_a, batch_stride_b, batch_stride_c;
  uint32_t alpha_bits, beta_bits;
  DType c_type, ab_type;
  bool trans_a, trans_b, has_bias;
  int lane;  // -1: the shared primitive on every thread; else the calling thread's own (this_thread_only)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    for (int64_t v : {k.batch, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.batch_stride_a, k.batch_stride_b,
                      k.batch_stride_c})
      mix(uint64_t(v));
    mix(k.alpha_bits), mix(k.beta_bits);
    mix(uint64_t(k.c_type) | uint64_t(k.ab_type) << 8 | uint64_t(k.trans_a) << 16 | uint64_t(k.trans_b) << 17 |
        uint64_t(k.has_bias) << 18 | uint64_t(k.lane + 1) << 19);
    return size_t(h);
  }
};

// A created primitive with memory objects whose data handles are swapped in per call, and the
// argument map built once (execute() takes it by reference).
struct Cached {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
  int64_t scratchpad_bytes = 0;
  std::string impl;
  bool single_thread = false;  // see create()
};

// Runs the enclosing scope with one OpenMP thread when `on` (oneDNN sizes its work split by
// omp_get_max_threads() both when a primitive is created and when it runs).
class ThreadLimit {
 public:
  explicit ThreadLimit(bool on) : saved_(on ? omp_get_max_threads() : 0) {
    if (on) omp_set_num_threads(1);
  }
  ~ThreadLimit() {
    if (saved_) omp_set_num_threads(saved_);
  }
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int saved_;
};

// A calling thread's own stream and scratchpad, for this_thread_only products that run
// concurrently (each thread on its own primitives, keyed by lane = its OpenMP thread number).
struct Lane {
  explicit Lane(const dnnl::engine& engine) : stream(engine) {}
  dnnl::stream stream;
  void* scratchpad = nullptr;
  int64_t scratchpad_bytes = 0;
};

struct State {
  std::mutex mu;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<Key, std::unique_ptr<Cached>, KeyHash> cache;
  int64_t created = 0;
  void* scratchpad = nullptr;  // shared by the lane -1 primitives: their calls are serialized by mu
  int64_t scratchpad_bytes = 0;
  std::vector<std::unique_ptr<Lane>> lanes;  // grown under mu; a Lane never moves
};

// Points the scratchpad at one at least `bytes` long, grown from our allocator. Caller holds s.mu.
void ensure_scratchpad(void*& ptr, int64_t& have, int64_t bytes) {
  if (bytes <= have) return;
  if (ptr) memory_free(ptr, size_t(have), MemCategory::temporaries);
  ptr = memory_alloc(size_t(bytes), MemCategory::temporaries);
  have = bytes;
}

// Never destroyed: a static destructor could run after the allocator's, and the OS reclaims
// everything at exit anyway.
State& state() {
  static State* s = new State;
  return *s;
}

dt to_dnnl(DType t) {
  switch (t) {
    case DType::f32: return dt::f32;
    case DType::bf16: return dt::bf16;
    default: break;
  }
  TITAN_FAIL("oneDNN matmul: unsupported dtype " + std::string(dtype_name(t)), "use f32 or bf16 operands");
}

// One operand as oneDNN sees it: logical [rows, cols] (op already applied), stored with row
// stride ld, or transposed (column stride ld). A batch stride of 0 means one matrix shared by
// every batch, which oneDNN expresses as a batch dimension of 1.
dnnl::memory::desc operand_desc(DType type, int64_t batch, int64_t batch_stride, int64_t rows, int64_t cols, int64_t ld,
                                bool transposed) {
  const int64_t row_stride = transposed ? 1 : ld, col_stride = transposed ? ld : 1;
  if (batch == 1) return dnnl::memory::desc({rows, cols}, to_dnnl(type), {row_stride, col_stride});
  const int64_t extent = transposed ? cols * ld : rows * ld;
  return dnnl::memory::desc({batch_stride == 0 ? 1 : batch, rows, cols}, to_dnnl(type),
                            {batch_stride == 0 ? extent : batch_stride, row_stride, col_stride});
}

// A shared B with row-major A and C stacked evenly is one tall product: [batch*M, K] @ [K, N].
// oneDNN blocks one big M better than many small batches (and a linear layer on [B, S, D]
// activations is exactly this case).
MatmulParams fold_batch(MatmulParams p) {
  if (p.batch > 1 && p.batch_stride_b == 0 && !p.trans_a && p.batch_stride_a == p.m * p.lda &&
      p.batch_stride_c == p.m * p.ldc) {
    p.m *= p.batch;
    p.batch = 1;
  }
  if (p.batch == 1) p.batch_stride_a = p.batch_stride_b = p.batch_stride_c = 0;
  return p;
}

std::unique_ptr<Cached> create(State& s, DType c_type, DType ab_type, bool has_bias, const MatmulParams& p) {
  const auto a_md = operand_desc(ab_type, p.batch, p.batch_stride_a, p.m, p.k, p.lda, p.trans_a);
  const auto b_md = operand_desc(ab_type, p.batch, p.batch_stride_b, p.k, p.n, p.ldb, p.trans_b);
  const auto c_md = operand_desc(c_type, p.batch, p.batch_stride_c, p.m, p.n, p.ldc, false);
  dnnl::primitive_attr attr;
  // Our scratchpad (from the titan allocator) instead of oneDNN allocating one per execution.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1) attr.set_output_scales(0, {p.alpha});
  if (p.beta != 0) {
    dnnl::post_ops ops;
    ops.append_sum(p.beta);
    attr.set_post_ops(ops);
  }
  auto c = std::make_unique<Cached>();
  try {
    const auto bias_md = p.batch == 1 ? dnnl::memory::desc({1, p.n}, to_dnnl(c_type), {p.n, 1})
                                      : dnnl::memory::desc({1, 1, p.n}, to_dnnl(c_type), {p.n, p.n, 1});
    auto make_pd = [&] {
      return has_bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, s.engine)
                      : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, s.engine);
    };
    dnnl::matmul::primitive_desc pd = make_pd();
    // oneDNN 2.6.3's AMX kernel (brg:avx512_core_amx_bf16) can run tile loads with no tile
    // configuration (SIGILL) when K is not a multiple of its 32-element K block and the work is
    // split across threads (seen at K = 63 with M and N tails; one thread never failed, and
    // neither did any K that is a multiple of 32). oneDNN offers no other bf16 implementation
    // for such layouts, so they are planned and run on one thread (the split is fixed when the
    // primitive is created). LLM shapes have K a multiple of 32 and keep every thread.
    c->single_thread = p.this_thread_only ||
                       (p.k % 32 != 0 && std::string_view(pd.impl_info_str()).find("amx") != std::string_view::npos);
    // A one-thread plan (this_thread_only, or the case above) and its primitive are both made
    // with one OpenMP thread: oneDNN reads the thread count at each of the two steps (a plan made
    // with one thread whose primitive was made with two overran its scratchpad).
    const ThreadLimit limit(c->single_thread);
    if (c->single_thread) pd = make_pd();
    if (has_bias) {
      c->bias = dnnl::memory(bias_md, s.engine, DNNL_MEMORY_NONE);
      c->args[DNNL_ARG_BIAS] = c->bias;
    }
    c->primitive = dnnl::matmul(pd);
    c->impl = pd.impl_info_str();
    c->a = dnnl::memory(a_md, s.engine, DNNL_MEMORY_NONE);
    c->b = dnnl::memory(b_md, s.engine, DNNL_MEMORY_NONE);
    c->c = dnnl::memory(c_md, s.engine, DNNL_MEMORY_NONE);
    c->args[DNNL_ARG_SRC] = c->a;
    c->args[DNNL_ARG_WEIGHTS] = c->b;
    c->args[DNNL_ARG_DST] = c->c;
    const auto scratch_md = pd.scratchpad_desc();
    c->scratchpad_bytes = int64_t(scratch_md.get_size());
    if (c->scratchpad_bytes > 0) {
      c->scratchpad = dnnl::memory(scratch_md, s.engine, DNNL_MEMORY_NONE);
      c->args[DNNL_ARG_SCRATCHPAD] = c->scratchpad;
    }
  } catch (const dnnl::error& e) {
    TITAN_FAIL("oneDNN could not create a matmul for M=" + std::to_string(p.m) + " N=" + std::to_string(p.n) +
                   " K=" + std::to_string(p.k) + " batch=" + std::to_string(p.batch) + ": " + e.what(),
               "check the operands' strides (inner stride 1, leading dims >= row length) and dtypes (f32 or bf16)");
  }
  ++s.created;
  return c;
}

// The cached primitive for this call, created on first use. Caller holds s.mu.
Cached& lookup(State& s, DType c_type, DType ab_type, bool has_bias, const MatmulParams& p, int lane = -1) {
  const Key key{p.batch,
                p.m,
                p.n,
                p.k,
                p.lda,
                p.ldb,
                p.ldc,
                p.batch_stride_a,
                p.batch_stride_b,
                p.batch_stride_c,
                std::bit_cast<uint32_t>(p.alpha),
                std::bit_cast<uint32_t>(p.beta),
                c_type,
                ab_type,
                p.trans_a,
                p.trans_b,
                has_bias,
                lane};
  auto it = s.cache.find(key);
  if (it == s.cache.end()) it = s.cache.emplace(key, create(s, c_type, ab_type, has_bias, p)).first;
  return *it->second;
}

// Whether oneDNN has a bf16 matmul on this CPU (it needs AVX-512: Debian's oneDNN has none for
// AVX2-only CPUs such as AMD Zen 3). Probed once with a small product.
bool native_bf16(State& s) {
  static const bool supported = [&s] {
    try {
      const dnnl::memory::desc md({8, 8}, dt::bf16, {8, 1}), cd({8, 8}, dt::f32, {8, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, cd), dnnl::primitive_attr(), s.engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return supported;
}

// Elements an operand's storage spans: [rows, cols] with leading dim ld (transposed: column-major),
// over `batch` matrices batch_stride apart (0: one shared matrix).
int64_t span(int64_t batch, int64_t batch_stride, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
  const int64_t one = transposed ? (cols - 1) * ld + rows : (rows - 1) * ld + cols;
  return batch_stride == 0 || batch == 1 ? one : (batch - 1) * batch_stride + one;
}

// Grow-only per-thread f32 buffers of the widened path (no allocation once a step's shapes were seen).
float* scratch(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

void widen(float* dst, const void* src, int64_t n) {
  const bf16* in = static_cast<const bf16*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(in[i]);
}

}  // namespace

void matmul(void* c, DType c_type, const void* a, const void* b, DType ab_type, const void* bias,
            const MatmulParams& params) {
  if (params.batch == 0 || params.m == 0 || params.n == 0) return;
  const MatmulParams p = fold_batch(params);
  State& s = state();
  if (ab_type == DType::bf16 && !native_bf16(s)) {
    // The same arithmetic as oneDNN's bf16 kernels (bf16 operands, f32 accumulation, one rounding
    // of C to bf16) as an f32 product of the widened operands, laid out as the originals. C's
    // elements are written back one by one: other threads may own the gaps between its rows.
    thread_local std::vector<float> af, bf, cf, biasf;
    const int64_t a_span = span(p.batch, p.batch_stride_a, p.m, p.k, p.lda, p.trans_a);
    const int64_t b_span = span(p.batch, p.batch_stride_b, p.k, p.n, p.ldb, p.trans_b);
    float* wa = scratch(af, a_span);
    float* wb = scratch(bf, b_span);
    widen(wa, a, a_span);
    widen(wb, b, b_span);
    const int64_t c_span = span(p.batch, p.batch_stride_c, p.m, p.n, p.ldc, false);
    float* wc = c_type == DType::f32 ? static_cast<float*>(c) : scratch(cf, c_span);
    if (c_type == DType::bf16 && p.beta != 0) widen(wc, c, c_span);
    const float* wbias = static_cast<const float*>(bias);
    if (bias && c_type == DType::bf16) {
      float* t = scratch(biasf, p.n);
      widen(t, bias, p.n);
      wbias = t;
    }
    matmul(wc, DType::f32, wa, wb, DType::f32, wbias, p);
    if (c_type == DType::bf16) {
      bf16* out = static_cast<bf16*>(c);
      for (int64_t bi = 0; bi < p.batch; ++bi)
        for (int64_t i = 0; i < p.m; ++i)
          for (int64_t j = 0; j < p.n; ++j) {
            const int64_t at = bi * p.batch_stride_c + i * p.ldc + j;
            out[at] = f32_to_bf16(wc[at]);
          }
    }
    return;
  }
  auto bind = [&](Cached& prim, void* scratchpad) {
    prim.a.set_data_handle(const_cast<void*>(a));
    prim.b.set_data_handle(const_cast<void*>(b));
    prim.c.set_data_handle(c);
    if (bias) prim.bias.set_data_handle(const_cast<void*>(bias));
    if (prim.scratchpad_bytes > 0) prim.scratchpad.set_data_handle(scratchpad);
  };
  if (p.this_thread_only) {
    // This thread's own primitive, stream and scratchpad: the lock covers only the lookup, so
    // the threads of a parallel region run their products at the same time.
    const int lane = omp_get_thread_num();
    Cached* prim = nullptr;
    Lane* own = nullptr;
    {
      std::lock_guard lock(s.mu);
      prim = &lookup(s, c_type, ab_type, bias != nullptr, p, lane);
      while (int(s.lanes.size()) <= lane) s.lanes.push_back(std::make_unique<Lane>(s.engine));
      own = s.lanes[size_t(lane)].get();
      ensure_scratchpad(own->scratchpad, own->scratchpad_bytes, prim->scratchpad_bytes);
    }
    bind(*prim, own->scratchpad);
    const ThreadLimit limit(true);
    prim->primitive.execute(own->stream, prim->args);
    own->stream.wait();
    return;
  }
  std::lock_guard lock(s.mu);
  Cached& prim = lookup(s, c_type, ab_type, bias != nullptr, p);
  ensure_scratchpad(s.scratchpad, s.scratchpad_bytes, prim.scratchpad_bytes);
  bind(prim, s.scratchpad);
  const ThreadLimit limit(prim.single_thread);
  prim.primitive.execute(s.stream, prim.args);
  s.stream.wait();  // CPU streams run in order already; this keeps it true for any runtime
}

std::string matmul_impl_name(DType c_type, DType ab_type, bool has_bias, const MatmulParams& params) {
  State& s = state();
  if (ab_type == DType::bf16 && !native_bf16(s))
    return "bf16 widened to f32: " + matmul_impl_name(DType::f32, DType::f32, has_bias, params);
  std::lock_guard lock(s.mu);
  return lookup(s, c_type, ab_type, has_bias, fold_batch(params)).impl;
}

MatmulCacheStats matmul_cache_stats() {
  State& s = state();
  std::lock_guard lock(s.mu);
  int64_t scratchpads = s.scratchpad_bytes;
  for (const auto& lane : s.lanes) scratchpads += lane->scratchpad_bytes;
  return {int64_t(s.cache.size()), s.created, scratchpads};
}

}  // namespace titan::kernels::onednn
