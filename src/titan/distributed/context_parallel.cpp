#include "titan/distributed/context_parallel.h"

#include <cstring>
#include <span>
#include <vector>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/cross_entropy.h"

namespace titan::distributed {

using autograd::GradSink;

namespace {

// x [B, L, ...] seen as B x L rows of `width` elements of `bytes` each.
struct Rows {
  int64_t batch, len, width;
  size_t elem;
  size_t row_bytes() const { return size_t(width) * elem; }
};

Rows rows_of(const Tensor& x) {
  TITAN_CHECK(x.dim() >= 2 && x.is_contiguous(), "context parallel: expected a contiguous [B, L, ...] tensor, got " + x.str());
  return {x.size(0), x.size(1), x.numel() / std::max<int64_t>(x.size(0) * x.size(1), 1), size_t(dtype_bits(x.dtype()) / 8)};
}

Shape with_len(const Shape& s, int64_t len) {
  Shape out = s;
  out[1] = len;
  return out;
}

// Copies rows [from, from + n) of every batch of src to rows [to, to + n) of dst.
void copy_rows(Tensor& dst, int64_t to, const Tensor& src, int64_t from, int64_t n) {
  const Rows d = rows_of(dst), s = rows_of(src);
  for (int64_t b = 0; b < s.batch; ++b)
    std::memcpy(static_cast<char*>(dst.data_ptr()) + size_t(b * d.len + to) * d.row_bytes(),
                static_cast<const char*>(src.data_ptr()) + size_t(b * s.len + from) * s.row_bytes(), size_t(n) * s.row_bytes());
}

float load(const Tensor& t, int64_t i) {
  return t.dtype() == DType::bf16 ? bf16_to_f32(t.data<bf16>()[i]) : t.data<float>()[i];
}
void store(Tensor& t, int64_t i, float v) {
  if (t.dtype() == DType::bf16) t.data<bf16>()[i] = f32_to_bf16(v);
  else t.data<float>()[i] = v;
}

// Adds rows [0, n) of every batch of src into rows [to, to + n) of dst (same dtype, f32 or bf16).
void add_rows(Tensor& dst, int64_t to, const Tensor& src, int64_t n) {
  const Rows d = rows_of(dst), s = rows_of(src);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < n * s.width; ++i) {
      const int64_t at = (b * d.len + to) * d.width + i;
      store(dst, at, load(dst, at) + load(src, (b * s.len) * s.width + i));
    }
}

// The all-gather's rank-major buffer [c, B, 2 S/2c, ...] <-> the natural order [B, S, ...].
void natural_from_ranks(Tensor& natural, const Tensor& ranks, const CpLayout& l) {
  const int64_t per_rank = ranks.numel() / l.degree;
  for (int k = 0; k < l.degree; ++k) {
    const Tensor piece = ranks.view({ranks.numel()}).slice(0, k * per_rank, (k + 1) * per_rank).view(with_len(natural.shape(), l.local_len()));
    CpLayout of_k = l;
    of_k.rank = k;
    for (int j = 0; j < 2; ++j) copy_rows(natural, of_k.chunk_start(j), piece, j * l.chunk(), l.chunk());
  }
}
void ranks_from_natural(Tensor& ranks, const Tensor& natural, const CpLayout& l) {
  const int64_t per_rank = ranks.numel() / l.degree;
  for (int k = 0; k < l.degree; ++k) {
    Tensor piece = ranks.view({ranks.numel()}).slice(0, k * per_rank, (k + 1) * per_rank).view(with_len(natural.shape(), l.local_len()));
    CpLayout of_k = l;
    of_k.rank = k;
    for (int j = 0; j < 2; ++j) copy_rows(piece, j * l.chunk(), natural, of_k.chunk_start(j), l.chunk());
  }
}

// preceding_rows' point-to-point tags: rows (and, backward, their gradients) moving to the
// next rank and to the previous one.
constexpr int kRightward = 0x5a01, kLeftward = 0x5a02, kGradRightward = 0x5a03, kGradLeftward = 0x5a04;

void give_gradient(GradSink& g, size_t i, const Tensor& value) {
  if (!g.needs(i) || g.adopt(i, value)) return;
  Tensor dx = g.grad(i);
  add_rows(dx, 0, value, value.size(1));
}

}  // namespace

CpLayout cp_layout(const ProcessGroup& cp, int64_t seq_len) {
  const int c = cp.size();
  TITAN_CHECK(seq_len % (2 * c) == 0,
              "context parallel: a sequence of " + std::to_string(seq_len) + " tokens does not split into 2 x " +
                  std::to_string(c) + " = " + std::to_string(2 * c) + " equal chunks (rank r holds chunks r and " +
                  std::to_string(2 * c - 1) + " - r)",
              "make the sequence length a multiple of " + std::to_string(2 * c) + ", e.g. " +
                  std::to_string(seq_len / (2 * c) * (2 * c)) + " or " + std::to_string((seq_len / (2 * c) + 1) * (2 * c)));
  return {c, cp.rank(), seq_len};
}

Tensor local_chunks(const Tensor& x, const CpLayout& layout) {
  TITAN_CHECK(x.dim() >= 2 && x.size(1) == layout.seq_len,
              "context parallel: expected [B, " + std::to_string(layout.seq_len) + ", ...], got " + x.str());
  const Tensor src = x.contiguous();
  Tensor out = Tensor::empty(with_len(x.shape(), layout.local_len()), x.dtype(), MemCategory::activations);
  for (int j = 0; j < 2; ++j) copy_rows(out, j * layout.chunk(), src, layout.chunk_start(j), layout.chunk());
  return out;
}

Tensor local_positions(int64_t batch, const CpLayout& layout) {
  Tensor p = Tensor::empty({batch, layout.local_len()}, DType::i32, MemCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int j = 0; j < 2; ++j)
      for (int64_t i = 0; i < layout.chunk(); ++i)
        p.data<int32_t>()[b * layout.local_len() + j * layout.chunk() + i] = int32_t(layout.chunk_start(j) + i);
  return p;
}

std::pair<Variable, double> mean_over_sequences(const Variable& local_mean, const Tensor& local_targets,
                                                const ProcessGroup& cp) {
  const Tensor t = local_targets.contiguous();
  TITAN_CHECK(t.dtype() == DType::i32, "mean_over_sequences: targets must be i32, got " + t.str());
  double valid = 0;
  for (int64_t i = 0; i < t.numel(); ++i) valid += t.data<int32_t>()[i] != kernels::kIgnoreIndex;
  double sums[2] = {local_mean.value().item() * valid, valid};
  cp.all_reduce(std::span<double>(sums, 2));
  if (sums[1] == 0) return {autograd::scale(local_mean, 0.0), 0.0};
  return {autograd::scale(local_mean, valid / sums[1]), sums[0] / sums[1]};
}

Variable gather_sequence(const Variable& x, const ProcessGroup& cp, const CpLayout& layout) {
  ProfileScope prof("cp.gather_sequence.fwd");
  const Tensor local = x.value().contiguous();
  TITAN_CHECK(local.dim() >= 2 && local.size(1) == layout.local_len(),
              "gather_sequence: expected [B, " + std::to_string(layout.local_len()) + ", ...], got " + local.str());
  Tensor ranks = Tensor::empty({int64_t(layout.degree) * local.numel()}, local.dtype());
  cp.all_gather(ranks, local.view({local.numel()})).wait();
  Tensor natural = Tensor::empty(with_len(local.shape(), layout.seq_len), local.dtype(), MemCategory::activations);
  natural_from_ranks(natural, ranks, layout);
  return autograd::record("cp.gather_sequence", {x}, natural, [&cp, layout, shape = local.shape()](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("cp.gather_sequence.bwd");
    const Tensor d = dy.contiguous();
    Tensor ranks_grad = Tensor::empty({d.numel()}, d.dtype());
    ranks_from_natural(ranks_grad, d, layout);
    Tensor mine = Tensor::empty(shape, d.dtype(), MemCategory::temporaries);
    cp.reduce_scatter(mine.view({mine.numel()}), ranks_grad).wait();
    give_gradient(g, 0, mine);
  });
}

std::array<Variable, 2> preceding_rows(const Variable& x, int64_t n, const ProcessGroup& cp, const CpLayout& layout) {
  ProfileScope prof("cp.preceding_rows.fwd");
  const int64_t len = layout.chunk();
  const int r = layout.rank, c = layout.degree;
  TITAN_CHECK(n >= 1 && n <= len,
              "preceding_rows: " + std::to_string(n) + " rows before each chunk of " + std::to_string(len),
              "a chunk's rows come from the one chunk before it: ask for 1 .. S / 2c of them");
  const Tensor local = x.value().contiguous();
  TITAN_CHECK(local.dim() >= 2 && local.size(1) == layout.local_len(),
              "preceding_rows: expected [B, " + std::to_string(layout.local_len()) + ", ...], got " + local.str());
  // The last n rows of each local chunk: chunk r's go to rank r + 1 (its chunk r + 1), chunk
  // 2c-1-r's to rank r - 1 (its chunk 2c-r); rank c - 1 holds chunks c - 1 and c and keeps its own.
  Tensor ends[2];
  for (int j = 0; j < 2; ++j) {
    ends[j] = Tensor::empty(with_len(local.shape(), n), local.dtype(), MemCategory::activations);
    copy_rows(ends[j], 0, local, j * len + len - n, n);
  }
  const bool left = r > 0, right = r < c - 1;
  Tensor got[2] = {Tensor::empty(with_len(local.shape(), left ? n : 0), local.dtype(), MemCategory::activations),
                   right ? Tensor::empty(with_len(local.shape(), n), local.dtype(), MemCategory::activations) : ends[0]};
  std::vector<Work> works;
  if (right) works.push_back(cp.send(ends[0], r + 1, kRightward)), works.push_back(cp.recv(got[1], r + 1, kLeftward));
  if (left) works.push_back(cp.send(ends[1], r - 1, kLeftward)), works.push_back(cp.recv(got[0], r - 1, kRightward));
  for (const Work& w : works) w.wait();
  std::vector<Variable> out = autograd::record(
      "cp.preceding_rows", {x}, {got[0], got[1]},
      [&cp, len, n, r, left, right, shape = local.shape(), dtype = local.dtype()](std::span<const Tensor> dy,
                                                                                  GradSink& g) {
        ProfileScope prof_bwd("cp.preceding_rows.bwd");
        // Each gradient goes back to the rows it came from; an unused one as zeros, so that every
        // send still has its receive.
        const auto grad_of = [&](size_t j) {
          return dy[j].defined() ? dy[j].contiguous() : Tensor::zeros(with_len(shape, n), dtype);
        };
        Tensor back[2];  // for this rank's chunk 0 end (from rank r + 1), chunk 1 end (from r - 1)
        std::vector<Work> pending;
        if (left) {
          back[1] = Tensor::empty(with_len(shape, n), dtype);
          pending.push_back(cp.send(grad_of(0), r - 1, kGradLeftward));
          pending.push_back(cp.recv(back[1], r - 1, kGradRightward));
        }
        if (right) {
          back[0] = Tensor::empty(with_len(shape, n), dtype);
          pending.push_back(cp.send(grad_of(1), r + 1, kGradRightward));
          pending.push_back(cp.recv(back[0], r + 1, kGradLeftward));
        } else {
          back[0] = grad_of(1);  // rank c - 1: chunk c's rows came from its own chunk c - 1
        }
        for (const Work& w : pending) w.wait();
        if (!g.needs(0)) return;
        Tensor dx = g.grad(0);
        add_rows(dx, len - n, back[0], n);
        if (left) add_rows(dx, 2 * len - n, back[1], n);
      });
  std::array<Variable, 2> result;
  if (left) result[0] = out[0];
  result[1] = out[1];
  return result;
}

Variable narrow_sequence(const Variable& x, int64_t start, int64_t len) {
  const Tensor src = x.value().contiguous();
  TITAN_CHECK(start >= 0 && len >= 0 && start + len <= src.size(1),
              "narrow_sequence: rows [" + std::to_string(start) + ", " + std::to_string(start + len) + ") of " + src.str());
  if (start == 0 && len == src.size(1)) return x;
  Tensor out = Tensor::empty(with_len(src.shape(), len), src.dtype(), MemCategory::activations);
  copy_rows(out, 0, src, start, len);
  return autograd::record("narrow_sequence", {x}, out, [start, len](const Tensor& dy, GradSink& g) {
    if (!g.needs(0)) return;
    Tensor dx = g.grad(0);
    add_rows(dx, start, dy.contiguous(), len);
  });
}

Variable concat_sequence(const Variable& a, const Variable& b) {
  const Tensor av = a.value().contiguous(), bv = b.value().contiguous();
  const int64_t la = av.size(1), lb = bv.size(1);
  Tensor out = Tensor::empty(with_len(av.shape(), la + lb), av.dtype(), MemCategory::activations);
  copy_rows(out, 0, av, 0, la);
  copy_rows(out, la, bv, 0, lb);
  return autograd::record("concat_sequence", {a, b}, out, [la, lb](const Tensor& dy, GradSink& g) {
    const Tensor d = dy.contiguous();
    for (size_t i = 0; i < 2; ++i) {
      if (!g.needs(i)) continue;
      const int64_t from = i == 0 ? 0 : la, n = i == 0 ? la : lb;
      Tensor part = Tensor::empty(with_len(d.shape(), n), d.dtype());
      copy_rows(part, 0, d, from, n);
      give_gradient(g, i, part);
    }
  });
}

}  // namespace titan::distributed
