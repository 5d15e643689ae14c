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

std::vector<int> muon_owners(const std::vector<std::pair<int64_t, int64_t>>& matrices, int ranks) {
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
    const int owner = int(std::min_element(load.begin(), load.end()) - load.begin());
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

std::pair<int64_t, int64_t> Muon::rows_of(int64_t rows, int ranks, int r) {
  const int64_t per = (rows + ranks - 1) / ranks;
  const int64_t begin = std::min(rows, int64_t(r) * per);
  return {begin, std::min(rows, begin + per) - begin};
}

Muon::Muon(std::vector<nn::TrainableParam> params, const MuonConfig& config, const std::optional<Swap>& swap,
           const distributed::ProcessGroup* shard_group)
    : config_(config) {
  TITAN_CHECK(config.ns_steps >= 1 && config.ns_steps < 100 && config.momentum >= 0 && config.momentum < 1,
              "Muon: ns_steps must be in [1, 100) and momentum in [0, 1)");
  std::vector<int64_t> sizes;
  int64_t largest = 0;
  const int ranks = shard_group ? shard_group->size() : 1, me = shard_group ? shard_group->rank() : 0;
  for (nn::TrainableParam& p : params) {
    const Tensor& v = p.var.value();
    Matrices mats = matrices_of(v.shape(), p.name);
    TITAN_CHECK(v.dtype() == DType::f32 && v.is_contiguous(), "Muon: parameter " + p.name + " must be contiguous f32");
    Slot s;
    const Shape local = v.shape(), global = p.slice.global_shape.empty() ? local : p.slice.global_shape;
    const int n = int(local.size());
    TITAN_CHECK(int(global.size()) == n && local[n - 1] == global[n - 1] && (n == 2 || local[n - 2] == global[n - 2]),
                "Muon: this rank holds " + local.str() + " of " + p.name + " " + global.str() +
                    ", not whole matrices or whole rows of one",
                "Muon orthogonalises whole matrices: its parameters may be split by rows over an FSDP group (or a "
                "stack of experts by experts), not by columns (tensor parallelism)");
    // Under FSDP every matrix is split by rows, also one whose rows all fall to one rank: every
    // rank then agrees on what is exchanged.
    if (n == 2 && ranks > 1) {
      const auto [begin, count] = rows_of(global[0], ranks, me);
      // (a rank past the last row holds none, wherever FSDP says its empty piece starts)
      const bool fsdp_rows = p.slice.offsets.size() == 2 && local[0] == count && (count == 0 || p.slice.offsets[0] == begin);
      TITAN_CHECK(fsdp_rows,
                  "Muon: this rank holds rows " + (p.slice.offsets.empty() ? std::string("?") : std::to_string(p.slice.offsets[0])) +
                      " + " + std::to_string(local[0]) + " of " + p.name + " " + global.str() +
                      ", not its rows of an FSDP split over the shard group given",
                  "Muon takes matrices split by FSDP's rows over the group given, not by tensor parallelism");
      s.split = true;
      mats.rows = global[0];
    } else {
      TITAN_CHECK(n != 2 || local[0] == global[0], "Muon: this rank holds " + local.str() + " of " + p.name + " " + global.str() +
                                             " and no FSDP shard group was given",
                  "give Muon the FSDP shard group that split the matrix");
    }
    if (!swap) s.buffer = Tensor::zeros(v.shape(), DType::f32, MemCategory::optimizer_state);
    s.count = mats.count, s.rows = mats.rows, s.cols = mats.cols;
    scratch_.fit(mats.rows, mats.cols);
    largest = std::max(largest, mats.rows * mats.cols);
    sizes.push_back(v.numel());
    s.param = std::move(p);
    slots_.push_back(std::move(s));
  }
  if (largest > 0) update_ = Tensor::empty({largest}, DType::f32, MemCategory::optimizer_state);
  TITAN_CHECK(config.ns_dtype == DType::f32 || config.ns_dtype == DType::bf16,
              "Muon: ns_dtype must be f32 or bf16, not " + std::string(dtype_name(config.ns_dtype)));
  if (config.ns_dtype == DType::bf16) scratch_.fit_bf16();

  std::vector<size_t> split;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].split) split.push_back(i), shapes.emplace_back(slots_[i].rows, slots_[i].cols);
  if (!split.empty()) {
    group_ = shard_group;
    const std::vector<int> owners = muon_owners(shapes, ranks);
    for (size_t k = 0; k < split.size(); ++k) slots_[split[k]].owner = owners[k];
    // send_: per owner, in slot order, this rank's rows; recv_: per source rank, in slot order,
    // its rows of the matrices this rank owns. The reverse exchange uses the same layouts.
    send_counts_.assign(size_t(ranks), 0);
    recv_counts_.assign(size_t(ranks), 0);
    int64_t at = 0;
    for (int o = 0; o < ranks; ++o)
      for (Slot& s : slots_)
        if (s.split && s.owner == o) {
          s.send_at = at;
          at += s.param.var.value().numel();
          send_counts_[size_t(o)] += s.param.var.value().numel();
        }
    int64_t in = 0;
    for (int src = 0; src < ranks; ++src)
      for (Slot& s : slots_)
        if (s.split && s.owner == me) {
          s.recv_at.resize(size_t(ranks));
          s.recv_at[size_t(src)] = in;
          const int64_t elems = rows_of(s.rows, ranks, src).second * s.cols;
          in += elems;
          recv_counts_[size_t(src)] += elems;
        }
    send_ = Tensor::empty({std::max<int64_t>(at, 1)}, DType::f32, MemCategory::optimizer_state);
    recv_ = Tensor::empty({std::max<int64_t>(in, 1)}, DType::f32, MemCategory::optimizer_state);
  }
  if (swap && !slots_.empty())
    swapped_ = std::make_unique<SwappedMoments>(std::move(sizes), swap->chunk_bytes,
                                                std::make_unique<FileSwapStore>(swap->file), 1);
}

Muon::~Muon() = default;

int64_t Muon::scratch_bytes() const {
  int64_t elems = 0;
  for (const Tensor* t : {&update_, &send_, &recv_})
    if (t->defined()) elems += t->numel();
  return scratch_.bytes() + elems * int64_t(sizeof(float));
}

int64_t Muon::exchanged_elements() const {
  int64_t n = 0;
  for (size_t r = 0; r < send_counts_.size(); ++r)
    if (int(r) != group_->rank()) n += send_counts_[r] + recv_counts_[r];
  return n;
}

int Muon::owned_matrices() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.split && s.owner == (group_ ? group_->rank() : -1);
  return n;
}

int Muon::split_matrices() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.split;
  return n;
}

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
  if (group_) update_split_matrices();
}

void Muon::update_split_matrices() {
  // Every rank of the group takes part in both exchanges, whatever it holds: the layouts are fixed.
  const int ranks = group_->size(), me = group_->rank();
  group_->all_to_allv(recv_, send_, send_counts_, recv_counts_).wait();
  for (Slot& s : slots_) {
    if (!s.split || s.owner != me || !s.param.var.grad().defined()) continue;
    float* u = update_.data<float>();  // [rows, cols]: the whole matrix, its pieces in rank order
    for (int src = 0; src < ranks; ++src) {
      const auto [begin, count] = rows_of(s.rows, ranks, src);
      const float* piece = recv_.data<float>() + s.recv_at[size_t(src)];
      std::copy(piece, piece + count * s.cols, u + begin * s.cols);
    }
    newton_schulz(u, s.rows, s.cols, config_, scratch_);
    for (int src = 0; src < ranks; ++src) {
      const auto [begin, count] = rows_of(s.rows, ranks, src);
      std::copy(u + begin * s.cols, u + (begin + count) * s.cols, recv_.data<float>() + s.recv_at[size_t(src)]);
    }
  }
  group_->all_to_allv(send_, recv_, recv_counts_, send_counts_).wait();
  for (Slot& s : slots_) {
    if (!s.split || !s.param.var.grad().defined()) continue;
    Tensor& value = s.param.var.mutable_value();
    float* p = value.data<float>();
    const float* o = send_.data<float>() + s.send_at;
    for (int64_t i = 0; i < value.numel(); ++i) p[i] = p[i] * s.decay + (-s.step_lr) * o[i];
    if (s.param.compute && s.param.compute->defined()) s.param.compute->copy_(value);  // copy_ rounds to bf16
  }
}

void Muon::update(Slot& s, int64_t begin, int64_t n, float* buf, float grad_scale) {
  Tensor& value = s.param.var.mutable_value();
  const int64_t size = s.rows * s.cols;
  const float mom = float(config_.momentum);
  const float* g = s.param.var.grad().data<float>();
  if (s.split) {  // this rank's rows: the mix goes to the owner (update_split_matrices)
    float* out = send_.data<float>() + s.send_at;
    for (int64_t i = begin; i < begin + n; ++i) {
      const float gi = g[i] * grad_scale;
      float& b = buf[i - begin];
      b = lerp(b, gi, 1.0f - mom);
      out[i] = config_.nesterov ? lerp(gi, b, mom) : b;
    }
    return;
  }
  float* u = update_.data<float>();
  for (int64_t at = begin, end = begin + n; at < end;) {
    const int64_t e = at / size, matrix_end = std::min(end, (e + 1) * size);
    for (int64_t i = at; i < matrix_end; ++i) {
      const float gi = g[i] * grad_scale;
      float& b = buf[i - begin];
      b = lerp(b, gi, 1.0f - mom);
      u[i - e * size] = config_.nesterov ? lerp(gi, b, mom) : b;
    }
    at = matrix_end;
    if (at != (e + 1) * size) break;  // the matrix goes on in the next piece
    newton_schulz(u, s.rows, s.cols, config_, scratch_);
    float* p = value.data<float>() + e * size;
    for (int64_t i = 0; i < size; ++i) p[i] = p[i] * s.decay + (-s.step_lr) * u[i];
  }
  if (begin + n == value.numel() && s.param.compute && s.param.compute->defined())
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
