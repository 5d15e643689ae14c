#include "titan/distributed/ring_attention.h"

#include <cstring>
#include <utility>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/attention_unmasked.h"
#include "titan/kernels/elementwise.h"

namespace titan::distributed {

using autograd::GradSink;
using autograd::Variable;

namespace {

constexpr int kKvTag = 11, kGradTag = 12;  // keys and values; their travelling gradients

// One rank's keys and values (or their gradients) by chunk in one flat buffer that a single send
// moves: [k early | v early | k late | v late], each [B, C, heads, width].
struct KvChunks {
  Tensor flat, k[2], v[2];
};

KvChunks kv_chunks(const Tensor& flat, const Shape& k_chunk, const Shape& v_chunk) {
  KvChunks out{flat, {}, {}};
  const int64_t nk = k_chunk.numel(), nv = v_chunk.numel();
  for (int j = 0; j < 2; ++j) {
    const int64_t at = j * (nk + nv);
    out.k[j] = flat.slice(0, at, at + nk).view(k_chunk);
    out.v[j] = flat.slice(0, at + nk, at + nk + nv).view(v_chunk);
  }
  return out;
}

Shape chunk_shape(const Tensor& x) { return {x.size(0), x.size(1) / 2, x.size(2), x.size(3)}; }

// Chunk buffers for keys and values shaped like k and v, in `dtype`.
KvChunks empty_chunks(const Tensor& k, const Tensor& v, DType dtype) {
  const Shape ks = chunk_shape(k), vs = chunk_shape(v);
  return kv_chunks(Tensor::empty({2 * (ks.numel() + vs.numel())}, dtype), ks, vs);
}

// Copies this rank's keys and values [B, 2C, ...] into their chunks.
void pack_chunks(KvChunks& dst, const Tensor& k, const Tensor& v) {
  const int64_t c = k.size(1) / 2;
  for (int j = 0; j < 2; ++j) {
    dst.k[j].copy_(k.slice(1, j * c, (j + 1) * c));
    dst.v[j].copy_(v.slice(1, j * c, (j + 1) * c));
  }
}

// Rows [j C, (j + 1) C) of x [B, 2C, ...] as a contiguous tensor.
Tensor half(const Tensor& x, int j) {
  const int64_t c = x.size(1) / 2;
  return x.slice(1, j * c, (j + 1) * c).contiguous();
}
Tensor late_lse(const Tensor& lse) {  // [B, H, 2C] -> [B, H, C] of the late rows
  const int64_t c = lse.size(2) / 2;
  return lse.slice(2, c, 2 * c).contiguous();
}

// The ring's neighbours and the rank whose keys arrive at step s.
struct Ring {
  const ProcessGroup& cp;
  int c, r;
  int next() const { return (r + 1) % c; }
  int prev() const { return (r + c - 1) % c; }
  int owner(int s) const { return (r - s + c) % c; }
};

// Sends `out` to the next rank and receives the next block from the previous one.
struct Exchange {
  Work send, recv;
  void post(const Ring& ring, const Tensor& out, const Tensor& in, int tag) {
    send = ring.cp.send(out, ring.next(), tag);
    recv = ring.cp.recv(in, ring.prev(), tag);
  }
  void wait() const {
    recv.wait();
    send.wait();
  }
};

// This rank's keys and values going around the ring, two blocks in flight: next(s) waits for
// step s's block (rank owner(s)'s) and starts passing it on while the caller computes with it.
class KvRotation {
 public:
  KvRotation(const Tensor& k, const Tensor& v, const Ring& ring)
      : ring_(ring), blocks_{empty_chunks(k, v, k.dtype()), empty_chunks(k, v, k.dtype())} {
    pack_chunks(blocks_[0], k, v);
    if (ring.c > 1) ex_.post(ring_, blocks_[0].flat, blocks_[1].flat, kKvTag);
  }
  const KvChunks& next(int s) {
    ex_.wait();  // the block sent last step has left, the one received is here
    cur_ = 1 - cur_;
    if (s + 1 < ring_.c) ex_.post(ring_, blocks_[cur_].flat, blocks_[1 - cur_].flat, kKvTag);
    return blocks_[cur_];
  }

 private:
  const Ring& ring_;
  KvChunks blocks_[2];
  Exchange ex_;
  int cur_ = 0;
};

struct ForwardResult {
  Tensor o, lse;  // o [B, L, H, Dv] in q's dtype, lse [B, H, L] f32
};

ForwardResult ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Ring& ring, double scale) {
  ProfileScope prof("cp.ring_attention.fwd");
  const int64_t b = q.size(0), l = q.size(1), h = q.size(2), dv = v.size(3), c = l / 2;
  Tensor o_part = Tensor::empty({b, l, h, dv}, q.dtype(), MemCategory::activations);
  Tensor lse = Tensor::empty({b, h, l}, DType::f32, MemCategory::activations);
  kernels::attention_forward(o_part, lse, q, k, v, scale);  // step 0: the local causal block
  Tensor o = o_part.dtype() == DType::f32 ? o_part : Tensor::empty({b, l, h, dv}, DType::f32, MemCategory::activations);
  if (o.data_ptr() != o_part.data_ptr()) o.copy_(o_part);

  const Tensor q_late = half(q, 1);
  Tensor part = Tensor::empty({b, c, h, dv}, q.dtype()), part_lse = Tensor::empty({b, h, c}, DType::f32);
  Tensor all_part = Tensor::empty({b, l, h, dv}, q.dtype()), all_lse = Tensor::empty({b, h, l}, DType::f32);
  KvRotation rotation(k, v, ring);
  for (int s = 1; s < ring.c; ++s) {
    const KvChunks& kv = rotation.next(s);
    if (ring.owner(s) < ring.r) {  // every local query over the owner's early chunk
      kernels::attention_unmasked_forward(all_part, all_lse, q, kv.k[0], kv.v[0], scale);
      kernels::attention_merge(o, lse, all_part, all_lse, 0);
    } else {  // the late queries over both of the owner's chunks
      for (int j = 0; j < 2; ++j) {
        kernels::attention_unmasked_forward(part, part_lse, q_late, kv.k[j], kv.v[j], scale);
        kernels::attention_merge(o, lse, part, part_lse, c);
      }
    }
  }
  if (o.dtype() == q.dtype()) return {o, lse};
  o_part.copy_(o);
  return {o_part, lse};
}

// dq, dk, dv (fresh, q's dtype) of the ring's attention given the final o and lse. They sum in
// f32 (the travelling key and value gradients too) and are rounded to q's dtype once at the end.
std::vector<Tensor> ring_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& o, const Tensor& lse, const Ring& ring, double scale) {
  ProfileScope prof("cp.ring_attention.bwd");
  const int64_t c = q.size(1) / 2;
  Tensor dq = Tensor::zeros(q.shape(), q.dtype()), dk = Tensor::zeros(k.shape(), k.dtype());
  Tensor dv = Tensor::zeros(v.shape(), v.dtype());
  kernels::attention_backward(dq, dk, dv, lse, dout, q, k, v, o, scale);  // step 0: the local causal block
  if (ring.c == 1) return {dq, dk, dv};
  dq = dq.to(DType::f32), dk = dk.to(DType::f32), dv = dv.to(DType::f32);

  // The gradient buffers that travel: the two this rank adds into (by step parity), the one arriving.
  KvChunks grads[2] = {empty_chunks(k, v, DType::f32), empty_chunks(k, v, DType::f32)};
  KvChunks incoming = empty_chunks(k, v, DType::f32);
  const Tensor q_late = half(q, 1), o_late = half(o, 1), dout_late = half(dout, 1), lse_late = late_lse(lse);
  Tensor dq_late = Tensor::zeros(q_late.shape(), DType::f32);
  Work grad_sends[2], grad_recv;
  KvRotation rotation(k, v, ring);
  for (int s = 1; s < ring.c; ++s) {
    const KvChunks& kv = rotation.next(s);
    KvChunks& g = grads[s % 2];
    grad_sends[s % 2].wait();  // the send of two steps ago read g
    std::memset(g.flat.data_ptr(), 0, g.flat.nbytes());
    if (ring.owner(s) < ring.r) {
      kernels::attention_unmasked_backward(dq, g.k[0], g.v[0], lse, dout, q, kv.k[0], kv.v[0], o, scale);
    } else {
      for (int j = 0; j < 2; ++j)
        kernels::attention_unmasked_backward(dq_late, g.k[j], g.v[j], lse_late, dout_late, q_late, kv.k[j], kv.v[j],
                                             o_late, scale);
    }
    if (s > 1) {  // the previous ranks' share of the same keys' gradients
      grad_recv.wait();
      kernels::add(g.flat, g.flat, incoming.flat);
    }
    grad_sends[s % 2] = ring.cp.send(g.flat, ring.next(), kGradTag);
    grad_recv = ring.cp.recv(incoming.flat, ring.prev(), kGradTag);  // next step's, or (last) this rank's own
  }
  grad_recv.wait();
  for (const Work& w : grad_sends) w.wait();
  for (int j = 0; j < 2; ++j) {  // the other ranks' share of this rank's key and value gradients
    Tensor dk_j = dk.slice(1, j * c, (j + 1) * c), dv_j = dv.slice(1, j * c, (j + 1) * c);
    Tensor sum_k = dk_j.contiguous(), sum_v = dv_j.contiguous();
    kernels::add(sum_k, sum_k, incoming.k[j]);
    kernels::add(sum_v, sum_v, incoming.v[j]);
    dk_j.copy_(sum_k), dv_j.copy_(sum_v);
  }
  Tensor dq_j = dq.slice(1, c, 2 * c), sum_q = dq_j.contiguous();
  kernels::add(sum_q, sum_q, dq_late);
  dq_j.copy_(sum_q);
  return {dq.to(q.dtype()), dk.to(k.dtype()), dv.to(v.dtype())};
}

void give_gradient(GradSink& g, size_t i, const Tensor& value) {
  if (!g.needs(i) || g.adopt(i, value)) return;
  Tensor d = g.grad(i);
  kernels::add(d, d, value);
}

}  // namespace

Variable ring_attention(const Variable& q, const Variable& k, const Variable& v, const ProcessGroup& cp,
                        std::optional<double> scale) {
  if (cp.size() == 1) return autograd::attention(q, k, v, scale);
  const Tensor qv = q.value().contiguous(), kv = k.value().contiguous(), vv = v.value().contiguous();
  TITAN_CHECK(qv.dim() == 4 && kv.dim() == 4 && vv.dim() == 4 && qv.size(1) % 2 == 0 && kv.size(1) == qv.size(1) &&
                  vv.size(1) == qv.size(1),
              "ring_attention: q " + qv.str() + ", k " + kv.str() + " and v " + vv.str() +
                  " must be [B, 2C, heads, dim], this rank's two chunks",
              "split the sequence with distributed::local_chunks first");
  const double sc = scale ? *scale : kernels::default_attention_scale(qv.size(3));
  const Ring ring{cp, cp.size(), cp.rank()};
  const std::vector<Tensor> out = autograd::keep_or_compute([&] {
    ForwardResult r = ring_forward(qv, kv, vv, ring, sc);
    return std::vector<Tensor>{r.o, r.lse};
  });
  return autograd::record("cp.ring_attention", {q, k, v}, out[0],
                          [qv, kv, vv, o = out[0], lse = out[1], ring, sc](const Tensor& dout, GradSink& g) {
                            const std::vector<Tensor> grads = ring_backward(dout.contiguous(), qv, kv, vv, o, lse, ring, sc);
                            for (size_t i = 0; i < 3; ++i) give_gradient(g, i, grads[i]);
                          });
}

RingTraffic ring_attention_traffic(int64_t kv_elements, DType dtype, int degree) {
  const double hops = degree - 1, n = double(kv_elements), bytes = dtype_bits(dtype) / 8.0;
  return {hops * n * bytes, hops * n * (bytes + 4)};  // backward: keys and values, then their f32 gradients
}

}  // namespace titan::distributed
