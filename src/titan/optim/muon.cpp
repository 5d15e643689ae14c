#include "titan/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "titan/core/error.h"
#include "titan/core/parallel.h"
#include "titan/kernels/matmul.h"
#include "titan/optim/swap_store.h"
#include "titan/optim/swapped_moments.h"

namespace titan::optim {

namespace {

// torch's lerp: start + w (end - start) for w < 1/2, else end - (end - start)(1 - w), in f32.
inline float lerp(float start, float end, float w) {
  const float diff = end - start;
  return w < 0.5f ? start + w * diff : end - diff * (1.0f - w);
}

// The matrices of a parameter: [rows, cols], or E of them stacked.
struct Matrices {
  int64_t count, rows, cols;
};
Matrices matrices_of(const Shape& s, const std::string& name) {
  TITAN_CHECK(s.size() == 2 || s.size() == 3,
              "Muon: parameter " + name + " is " + s.str() + ", not a matrix [rows, cols] or experts [E, rows, cols]",
              "give Muon the hidden matrices; embeddings, the output head, norms and biases go to AdamW");
  if (s.size() == 2) return {1, s[0], s[1]};
  return {s[0], s[1], s[2]};
}

}  // namespace

std::vector<int> muon_owners(const std::vector<std::pair<int64_t, int64_t>>& matrices, int ranks,
                             const std::vector<std::vector<int>>& holders) {
  auto cost = [](const std::pair<int64_t, int64_t>& shape) {
    const double m = double(std::min(shape.first, shape.second)), w = double(std::max(shape.first, shape.second));
    return 4 * m * m * w + 2 * m * m * m;
  };
  std::vector<size_t> order(matrices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost(matrices[a]) > cost(matrices[b]); });
  std::vector<double> load(size_t(ranks), 0.0);
  std::vector<int> owners(matrices.size(), 0);
  for (size_t i : order) {
    int owner = -1;
    auto consider = [&](int r) {
      if (owner < 0 || load[size_t(r)] < load[size_t(owner)]) owner = r;
    };
    if (i < holders.size() && !holders[i].empty()) {
      for (int r : holders[i]) consider(r);  // holders in rank order: the lowest of a tie
    } else {
      for (int r = 0; r < ranks; ++r) consider(r);
    }
    owners[i] = owner;
    load[size_t(owner)] += cost(matrices[i]);
  }
  return owners;
}

double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonLrAdjust adjust) {
  switch (adjust) {
    case MuonLrAdjust::original: return lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
    case MuonLrAdjust::match_rms_adamw: return lr * 0.2 * std::sqrt(double(std::max(rows, cols)));
  }
  return lr;
}

void NewtonSchulzScratch::fit(int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  if (m * n > wide_) {
    wide_ = m * n;
    x_ = Tensor::empty({wide_}, DType::f32, MemCategory::optimizer_state);
    next_ = Tensor::empty({wide_}, DType::f32, MemCategory::optimizer_state);
    if (x16_.defined()) x16_ = Tensor::empty({wide_}, DType::bf16, MemCategory::optimizer_state);
  }
  if (m * m > small_) {
    small_ = m * m;
    gram_ = Tensor::empty({small_}, DType::f32, MemCategory::optimizer_state);
    poly_ = Tensor::empty({small_}, DType::f32, MemCategory::optimizer_state);
    if (gram16_.defined()) {
      gram16_ = Tensor::empty({small_}, DType::bf16, MemCategory::optimizer_state);
      poly16_ = Tensor::empty({small_}, DType::bf16, MemCategory::optimizer_state);
    }
  }
}

void NewtonSchulzScratch::fit_bf16() {
  if (x16_.defined()) return;
  x16_ = Tensor::empty({std::max<int64_t>(wide_, 1)}, DType::bf16, MemCategory::optimizer_state);
  gram16_ = Tensor::empty({std::max<int64_t>(small_, 1)}, DType::bf16, MemCategory::optimizer_state);
  poly16_ = Tensor::empty({std::max<int64_t>(small_, 1)}, DType::bf16, MemCategory::optimizer_state);
}

int64_t NewtonSchulzScratch::bytes() const {
  return 2 * (wide_ + small_) * int64_t(sizeof(float)) + (x16_.defined() ? (wide_ + 2 * small_) * 2 : 0);
}

namespace {
// dst = bf16(src), n elements, over the threads.
void round_to_bf16(bf16* dst, const float* src, int64_t n) {
  parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dst[i] = f32_to_bf16(src[i]);
  });
}
}  // namespace

void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonConfig& c, NewtonSchulzScratch& s) {
  const bool transposed = rows > cols;
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  TITAN_CHECK(m * n <= s.wide_ && m * m <= s.small_,
              "newton_schulz: the scratch does not fit a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] matrix",
              "call NewtonSchulzScratch::fit with every shape first");
  float* cur = s.x_.data<float>();   // [m, n]
  float* next = s.next_.data<float>();  // [m, n]
  float* gram = s.gram_.data<float>();  // [m, m]
  float* poly = s.poly_.data<float>();  // [m, m]
  if (transposed) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) cur[k * rows + r] = x[r * cols + k];
  } else {
    std::copy(x, x + m * n, cur);
  }
  double sq = 0;
  for (int64_t i = 0; i < m * n; ++i) sq += double(cur[i]) * double(cur[i]);
  const float inv = float(1.0 / std::max(std::sqrt(sq), c.eps));
  for (int64_t i = 0; i < m * n; ++i) cur[i] *= inv;
  const auto [a, b, cc] = c.ns_coefficients;
  kernels::MatmulParams xxt = kernels::dense_matmul_params(1, m, m, n, false, true);  // A = X X^T
  kernels::MatmulParams aa = kernels::dense_matmul_params(1, m, m, m, false, false);  // b A + c A A
  aa.alpha = float(cc), aa.beta = float(b);
  kernels::MatmulParams bx = kernels::dense_matmul_params(1, m, n, m, false, false);  // a X + (b A + c A A) X
  bx.alpha = 1.0f, bx.beta = float(a);
  const bool half = c.ns_dtype == DType::bf16;
  TITAN_CHECK(c.ns_dtype == DType::f32 || (half && s.x16_.defined()),
              "newton_schulz: ns_dtype must be f32, or bf16 with NewtonSchulzScratch::fit_bf16 called");
  bf16* x16 = half ? s.x16_.data<bf16>() : nullptr;
  bf16* gram16 = half ? s.gram16_.data<bf16>() : nullptr;
  bf16* poly16 = half ? s.poly16_.data<bf16>() : nullptr;
  for (int step = 0; step < c.ns_steps; ++step) {
    std::copy(cur, cur + m * n, next);
    if (half) {
      round_to_bf16(x16, cur, m * n);
      kernels::matmul(gram, DType::f32, x16, x16, DType::bf16, nullptr, xxt);
      std::copy(gram, gram + m * m, poly);
      round_to_bf16(gram16, gram, m * m);
      kernels::matmul(poly, DType::f32, gram16, gram16, DType::bf16, nullptr, aa);
      round_to_bf16(poly16, poly, m * m);
      kernels::matmul(next, DType::f32, poly16, x16, DType::bf16, nullptr, bx);
    } else {
      kernels::matmul(gram, DType::f32, cur, cur, DType::f32, nullptr, xxt);
      std::copy(gram, gram + m * m, poly);
      kernels::matmul(poly, DType::f32, gram, gram, DType::f32, nullptr, aa);
      kernels::matmul(next, DType::f32, poly, cur, DType::f32, nullptr, bx);
    }
    std::swap(cur, next);
  }
  if (transposed) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) x[r * cols + k] = cur[k * rows + r];
  } else {
    std::copy(cur, cur + m * n, x);
  }
}

void newton_schulz(Tensor& x, const MuonConfig& c) {
  TITAN_CHECK(x.dim() == 2 && x.dtype() == DType::f32 && x.is_contiguous(),
              "newton_schulz: x must be a contiguous f32 matrix, got " + x.str());
  NewtonSchulzScratch scratch;
  scratch.fit(x.size(0), x.size(1));
  if (c.ns_dtype == DType::bf16) scratch.fit_bf16();
  newton_schulz(x.data<float>(), x.size(0), x.size(1), c, scratch);
}

Muon::Muon(std::vector<nn::TrainableParam> params, const MuonConfig& config, const std::optional<Swap>& swap,
           const distributed::ProcessGroup* shard_group, const distributed::ProcessGroup* tp_shard_group)
    : config_(config) {
  TITAN_CHECK(config.ns_steps >= 1 && config.ns_steps < 100 && config.momentum >= 0 && config.momentum < 1,
              "Muon: ns_steps must be in [1, 100) and momentum in [0, 1)");
  TITAN_CHECK(config.ns_dtype == DType::f32 || config.ns_dtype == DType::bf16,
              "Muon: ns_dtype must be f32 or bf16, not " + std::string(dtype_name(config.ns_dtype)));
  if (shard_group && shard_group->size() == 1) shard_group = nullptr;
  if (tp_shard_group && tp_shard_group->size() == 1) tp_shard_group = nullptr;
  std::vector<int64_t> sizes;
  std::vector<size_t> by_shard, by_tp;  // the slots whose pieces each group holds
  int64_t largest = 0;
  for (nn::TrainableParam& p : params) {
    const Tensor& v = p.var.value();
    TITAN_CHECK(v.dtype() == DType::f32 && v.is_contiguous(), "Muon: parameter " + p.name + " must be contiguous f32");
    const Shape global = p.slice.global_shape.empty() ? v.shape() : p.slice.global_shape;
    const Matrices whole = matrices_of(global, p.name), here = matrices_of(v.shape(), p.name);
    Slot s;
    s.count = here.count, s.rows = whole.rows, s.cols = whole.cols, s.piece = here.rows * here.cols;
    s.send_at.assign(size_t(s.count), -1);
    const bool whole_here = here.rows == whole.rows && here.cols == whole.cols;
    if (tp_shard_group && p.tp_dim >= 0) {
      by_tp.push_back(slots_.size());
    } else if (shard_group) {
      by_shard.push_back(slots_.size());
    } else {
      TITAN_CHECK(whole_here, "Muon: this rank holds " + v.shape().str() + " of " + p.name + " " + global.str() +
                                  " and no group was given that holds the rest",
                  "give Muon the FSDP shard group (and under tensor parallelism the dp_shard x cp x tp group) "
                  "that split the matrix");
    }
    if (!swap) s.buffer = Tensor::zeros(v.shape(), DType::f32, MemCategory::optimizer_state);
    scratch_.fit(whole.rows, whole.cols);
    largest = std::max(largest, whole.rows * whole.cols);
    sizes.push_back(v.numel());
    s.param = std::move(p);
    slots_.push_back(std::move(s));
  }
  if (largest > 0) update_ = Tensor::empty({largest}, DType::f32, MemCategory::optimizer_state);
  if (config.ns_dtype == DType::bf16) scratch_.fit_bf16();
  // Every rank of a group builds the same slots in the same order, so the groups' collectives match.
  if (shard_group) plan_exchange(*shard_group, by_shard);
  if (tp_shard_group) {
    plan_exchange(*tp_shard_group, by_tp);
    if (!exchanges_.empty() && exchanges_.back().group == tp_shard_group) tp_exchange_ = int(exchanges_.size()) - 1;
  }
  if (swap && !slots_.empty())
    swapped_ = std::make_unique<SwappedMoments>(std::move(sizes), swap->chunk_bytes,
                                                std::make_unique<FileSwapStore>(swap->file), 1);
}

void Muon::plan_exchange(const distributed::ProcessGroup& group, const std::vector<size_t>& members) {
  const int ranks = group.size(), me = group.rank();
  // Each rank's piece of each member slot: its first expert and expert count, the first row and
  // column of each of its matrices and their rows and columns (all-reduced: each rank fills its own).
  constexpr size_t kFields = 6;
  std::vector<double> all(size_t(ranks) * members.size() * kFields, 0.0);
  for (size_t k = 0; k < members.size(); ++k) {
    const Slot& s = slots_[members[k]];
    const Shape local = s.param.var.value().shape(), off = s.param.slice.offsets;
    const int n = int(local.size());
    auto offset = [&](int d) { return off.empty() ? 0.0 : double(off[size_t(d)]); };
    double* f = all.data() + (size_t(me) * members.size() + k) * kFields;
    f[0] = n == 3 ? offset(0) : 0, f[1] = double(s.count);
    f[2] = offset(n - 2), f[3] = offset(n - 1), f[4] = double(local[n - 2]), f[5] = double(local[n - 1]);
  }
  group.all_reduce(std::span<double>(all));
  auto field = [&](int r, size_t k, size_t i) { return int64_t(all[(size_t(r) * members.size() + k) * kFields + i]); };

  // The split matrices (slot, expert), each with every rank's piece; whole ones stay local.
  struct Split {
    size_t member;
    int64_t expert;
    std::vector<Piece> pieces;
    std::vector<int> holders;
  };
  std::vector<Split> split;
  for (size_t k = 0; k < members.size(); ++k) {
    Slot& s = slots_[members[k]];
    const Shape global = s.param.slice.global_shape.empty() ? s.param.var.value().shape() : s.param.slice.global_shape;
    const int64_t experts = global.size() == 3 ? global[0] : 1;
    for (int64_t e = 0; e < experts; ++e) {
      Split m{k, e, std::vector<Piece>(size_t(ranks)), {}};
      int whole = 0;
      int64_t area = 0;
      for (int r = 0; r < ranks; ++r) {
        if (e < field(r, k, 0) || e >= field(r, k, 0) + field(r, k, 1)) continue;
        const Piece p{field(r, k, 2), field(r, k, 3), field(r, k, 4), field(r, k, 5)};
        if (p.size() == 0) continue;
        TITAN_CHECK(p.row >= 0 && p.col >= 0 && p.row + p.rows <= s.rows && p.col + p.cols <= s.cols,
                    "Muon: rank " + std::to_string(r) + " of " + group.name() + " holds rows " + std::to_string(p.row) +
                        " + " + std::to_string(p.rows) + ", columns " + std::to_string(p.col) + " + " +
                        std::to_string(p.cols) + " of " + s.param.name + "'s [" + std::to_string(s.rows) + ", " +
                        std::to_string(s.cols) + "] matrices, outside them");
        for (int q : m.holders) {
          const Piece& o = m.pieces[size_t(q)];
          const bool overlap = p.row < o.row + o.rows && o.row < p.row + p.rows && p.col < o.col + o.cols &&
                               o.col < p.col + p.cols;
          TITAN_CHECK(!overlap || (p.size() == s.rows * s.cols && o.size() == s.rows * s.cols),
                      "Muon: ranks " + std::to_string(q) + " and " + std::to_string(r) + " of " + group.name() +
                          " hold overlapping pieces of " + s.param.name + " (matrix " + std::to_string(e) + ")",
                      "Muon gathers a matrix from disjoint pieces: FSDP's rows and tensor parallelism's splits");
        }
        m.pieces[size_t(r)] = p;
        m.holders.push_back(r);
        area += p.size();
        whole += p.size() == s.rows * s.cols;
      }
      if (m.holders.empty() || whole > 0) {  // held whole (by every holder), or at no rank of the group
        TITAN_CHECK(whole == int(m.holders.size()), "Muon: some ranks of " + group.name() + " hold " + s.param.name +
                                                        " whole, others a piece of it");
        continue;
      }
      TITAN_CHECK(area == s.rows * s.cols, "Muon: the pieces of " + s.param.name + " over " + group.name() + " cover " +
                                               std::to_string(area) + " of its " + std::to_string(s.rows * s.cols) +
                                               " elements (matrix " + std::to_string(e) + ")",
                  "Muon gathers a matrix from the ranks that split it: give it the group that holds every piece");
      split.push_back(std::move(m));
    }
  }
  if (split.empty()) return;

  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::vector<std::vector<int>> holders;
  for (const Split& m : split) {
    const Slot& s = slots_[members[m.member]];
    shapes.emplace_back(s.rows, s.cols);
    holders.push_back(m.holders);
  }
  const std::vector<int> owners = muon_owners(shapes, ranks, holders);
  Exchange x;
  x.group = &group;
  x.matrices = int(split.size());
  x.send_counts.assign(size_t(ranks), 0);
  x.recv_counts.assign(size_t(ranks), 0);
  // send: per owner, in matrix order, this rank's pieces; recv: per source rank, in matrix order,
  // its pieces of the matrices this rank owns. The reverse exchange uses the same layouts.
  int64_t at = 0;
  for (int o = 0; o < ranks; ++o)
    for (size_t i = 0; i < split.size(); ++i) {
      const Piece& mine = split[i].pieces[size_t(me)];
      if (owners[i] != o || mine.size() == 0) continue;
      Slot& s = slots_[members[split[i].member]];
      s.exchange = int(exchanges_.size());
      s.send_at[size_t(split[i].expert - field(me, split[i].member, 0))] = at;
      at += mine.size();
      x.send_counts[size_t(o)] += mine.size();
    }
  for (size_t i = 0; i < split.size(); ++i)
    if (owners[i] == me)
      x.owned.push_back({members[split[i].member], split[i].pieces, std::vector<int64_t>(size_t(ranks), 0)});
  int64_t in = 0;
  for (int src = 0; src < ranks; ++src)
    for (Exchange::Owned& o : x.owned) {
      o.recv_at[size_t(src)] = in;
      in += o.pieces[size_t(src)].size();
      x.recv_counts[size_t(src)] += o.pieces[size_t(src)].size();
    }
  x.send = Tensor::empty({std::max<int64_t>(at, 1)}, DType::f32, MemCategory::optimizer_state);
  x.recv = Tensor::empty({std::max<int64_t>(in, 1)}, DType::f32, MemCategory::optimizer_state);
  exchanges_.push_back(std::move(x));
}

Muon::~Muon() = default;

int64_t Muon::scratch_bytes() const {
  int64_t elems = update_.defined() ? update_.numel() : 0;
  for (const Exchange& x : exchanges_) elems += x.send.numel() + x.recv.numel();
  return scratch_.bytes() + elems * int64_t(sizeof(float));
}

namespace {
int64_t exchanged(const std::vector<int64_t>& send, const std::vector<int64_t>& recv, int me) {
  int64_t n = 0;
  for (size_t r = 0; r < send.size(); ++r)
    if (int(r) != me) n += send[r] + recv[r];
  return n;
}
}  // namespace

int64_t Muon::exchanged_elements() const {
  int64_t n = 0;
  for (const Exchange& x : exchanges_) n += exchanged(x.send_counts, x.recv_counts, x.group->rank());
  return n;
}

int Muon::owned_matrices() const {
  int n = 0;
  for (const Exchange& x : exchanges_) n += int(x.owned.size());
  return n;
}

int Muon::split_matrices() const {
  int n = 0;
  for (const Exchange& x : exchanges_) n += x.matrices;
  return n;
}

int64_t Muon::tp_exchanged_elements() const {
  if (tp_exchange_ < 0) return 0;
  const Exchange& x = exchanges_[size_t(tp_exchange_)];
  return exchanged(x.send_counts, x.recv_counts, x.group->rank());
}

int Muon::tp_owned_matrices() const {
  return tp_exchange_ < 0 ? 0 : int(exchanges_[size_t(tp_exchange_)].owned.size());
}

int Muon::tp_split_matrices() const { return tp_exchange_ < 0 ? 0 : exchanges_[size_t(tp_exchange_)].matrices; }

void Muon::check_usable() const {
  TITAN_CHECK(!broken_, "Muon: a swapped optimizer step failed midway (" + swapped_->store().describe() +
                            "): the parameters and momentum buffers are no longer one step's",
              "restart from the last checkpoint once the swap file can be written (see [optimizer] swap_path)");
}

void Muon::step(float lr, float grad_scale) {
  check_usable();
  for (Slot& s : slots_) {
    if (!s.param.var.grad().defined()) continue;
    const Tensor& value = s.param.var.value();
    const Tensor& grad = s.param.var.grad();
    TITAN_CHECK(grad.is_contiguous() && grad.dtype() == DType::f32 && grad.shape() == value.shape(),
                "Muon: the gradient of " + s.param.name + " must be contiguous f32 " + value.shape().str() + ", got " +
                    grad.str());
    s.decay = float(1.0 - double(lr) * (s.param.weight_decay ? config_.weight_decay : 0.0));
    s.step_lr = float(muon_adjusted_lr(lr, s.rows, s.cols, config_.adjust));
  }
  if (swapped_) {
    // A step that fails midway (a write error) has updated some matrices and not others.
    broken_ = true;
    swapped_->for_each(SwappedMoments::Access::update, [&](const SwappedMoments::Piece& p) {
      Slot& s = slots_[size_t(p.tensor)];
      if (s.param.var.grad().defined()) update(s, p.begin, p.n, p.exp_avg, grad_scale);
    });
    broken_ = false;
  } else {
    for (Slot& s : slots_)
      if (s.param.var.grad().defined()) update(s, 0, s.buffer.numel(), s.buffer.data<float>(), grad_scale);
  }
  for (Exchange& x : exchanges_) update_split_matrices(x);
}

void Muon::update_split_matrices(Exchange& x) {
  // Every rank of the group takes part in both exchanges, whatever it holds: the layouts are fixed.
  const int ranks = x.group->size();
  const int index = int(&x - exchanges_.data());
  x.group->all_to_allv(x.recv, x.send, x.send_counts, x.recv_counts).wait();
  for (const Exchange::Owned& o : x.owned) {
    const Slot& s = slots_[o.slot];
    if (!s.param.var.grad().defined()) continue;
    float* u = update_.data<float>();  // [rows, cols]: the whole matrix, assembled from its pieces
    float* recv = x.recv.data<float>();
    auto each_piece_row = [&](auto&& copy) {
      for (int src = 0; src < ranks; ++src) {
        const Piece& p = o.pieces[size_t(src)];
        for (int64_t r = 0; r < p.rows; ++r)
          copy(recv + o.recv_at[size_t(src)] + r * p.cols, u + (p.row + r) * s.cols + p.col, p.cols);
      }
    };
    each_piece_row([](const float* piece, float* matrix, int64_t n) { std::copy(piece, piece + n, matrix); });
    newton_schulz(u, s.rows, s.cols, config_, scratch_);
    each_piece_row([](float* piece, const float* matrix, int64_t n) { std::copy(matrix, matrix + n, piece); });
  }
  x.group->all_to_allv(x.send, x.recv, x.recv_counts, x.send_counts).wait();
  for (Slot& s : slots_) {
    if (s.exchange != index || !s.param.var.grad().defined()) continue;
    Tensor& value = s.param.var.mutable_value();
    for (int64_t k = 0; k < s.count; ++k) {
      if (s.send_at[size_t(k)] < 0) continue;  // whole here: applied by update()
      float* p = value.data<float>() + k * s.piece;
      const float* o = x.send.data<float>() + s.send_at[size_t(k)];
      for (int64_t i = 0; i < s.piece; ++i) p[i] = p[i] * s.decay + (-s.step_lr) * o[i];
    }
    if (s.param.compute && s.param.compute->defined()) s.param.compute->copy_(value);  // copy_ rounds to bf16
  }
}

void Muon::update(Slot& s, int64_t begin, int64_t n, float* buf, float grad_scale) {
  Tensor& value = s.param.var.mutable_value();
  const int64_t size = s.piece;
  if (size == 0) return;
  const float mom = float(config_.momentum);
  const float* g = s.param.var.grad().data<float>();
  for (int64_t at = begin, end = begin + n; at < end;) {
    const int64_t e = at / size, matrix_end = std::min(end, (e + 1) * size);
    const int64_t send_at = s.send_at[size_t(e)];
    // A split matrix's piece: the mix goes to its owner (update_split_matrices); a whole one's here.
    float* u = send_at >= 0 ? exchanges_[size_t(s.exchange)].send.data<float>() + send_at : update_.data<float>();
    for (int64_t i = at; i < matrix_end; ++i) {
      const float gi = g[i] * grad_scale;
      float& b = buf[i - begin];
      b = lerp(b, gi, 1.0f - mom);
      u[i - e * size] = config_.nesterov ? lerp(gi, b, mom) : b;
    }
    at = matrix_end;
    if (send_at >= 0) continue;
    if (at != (e + 1) * size) break;  // the matrix goes on in the next piece
    newton_schulz(u, s.rows, s.cols, config_, scratch_);
    float* p = value.data<float>() + e * size;
    for (int64_t i = 0; i < size; ++i) p[i] = p[i] * s.decay + (-s.step_lr) * u[i];
  }
  if (begin + n == value.numel() && !s.any_split() && s.param.compute && s.param.compute->defined())
    s.param.compute->copy_(value);  // copy_ rounds to bf16
}

std::vector<std::pair<std::string, Shape>> Muon::state_shapes() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const Slot& s : slots_) out.emplace_back(s.param.name + ".momentum_buffer", s.param.var.value().shape());
  return out;
}

std::vector<std::pair<std::string, Tensor>> Muon::state_dict() const {
  check_usable();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Slot& s : slots_)
    out.emplace_back(s.param.name + ".momentum_buffer",
                     swapped_ ? Tensor::empty(s.param.var.value().shape(), DType::f32, MemCategory::temporaries)
                              : s.buffer);
  if (swapped_)
    swapped_->for_each(SwappedMoments::Access::read, [&](const SwappedMoments::Piece& p) {
      std::memcpy(out[size_t(p.tensor)].second.data<float>() + p.begin, p.exp_avg, size_t(p.n) * sizeof(float));
    });
  return out;
}

SavedState Muon::state_for_save() const {
  check_usable();
  SavedState out;
  for (const Slot& s : slots_) {
    const std::string key = s.param.name + ".momentum_buffer";
    if (swapped_)
      out.streamed.emplace_back(key, s.param.var.value().shape());
    else
      out.in_memory.emplace_back(key, s.buffer);
  }
  if (swapped_)
    out.stream = [buffers = swapped_.get()](const SavedState::Emit& emit) {
      buffers->for_each(SwappedMoments::Access::read,
                        [&](const SwappedMoments::Piece& p) { emit(size_t(p.tensor), p.begin, p.exp_avg, p.n); });
    };
  return out;
}

void Muon::check_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) const {
  for (const Slot& s : slots_) {
    const std::string key = s.param.name + ".momentum_buffer";
    const Shape shape = s.param.var.value().shape();
    const auto it = state.find(key);
    TITAN_CHECK(it != state.end() && it->second.shape() == shape,
                source + ": Muon state '" + key + "' is " +
                    (it == state.end() ? std::string("missing") : it->second.shape().str()) + ", expected " +
                    shape.str(),
                "load a checkpoint trained with Muon on the same model");
  }
}

void Muon::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  check_state_dict(state, source);
  broken_ = false;
  std::vector<Tensor> loaded;
  for (Slot& s : slots_) {
    const Tensor& t = state.at(s.param.name + ".momentum_buffer");
    if (!swapped_) {
      s.buffer.copy_(t);
      continue;
    }
    loaded.push_back(t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32));
  }
  if (swapped_)
    swapped_->for_each(SwappedMoments::Access::overwrite, [&](const SwappedMoments::Piece& p) {
      std::memcpy(p.exp_avg, loaded[size_t(p.tensor)].data<float>() + p.begin, size_t(p.n) * sizeof(float));
    });
}

}  // namespace titan::optim
