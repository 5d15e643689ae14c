// The routed path of an MoE layer composed from the kernels' reference twins in double:
// router -> sort by expert -> permute -> grouped SwiGLU experts -> weighted unpermute, and its
// backward in the same order as models/moe/moe.cpp. The gradient check checks this composition
// against finite differences; the module test checks the module against it.
#pragma once

#include <vector>

#include "common/gradcheck.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/ref/activation.h"
#include "titan/kernels/ref/grouped_matmul.h"
#include "titan/kernels/ref/matmul.h"
#include "titan/kernels/ref/moe_permute.h"
#include "titan/kernels/ref/moe_router.h"

namespace titan::test {

struct MoeRefDims {
  int64_t batch, seq, d, f;
  kernels::RouterParams p;
  double aux_alpha = 0;
  int64_t tokens() const { return batch * seq; }
};

// Inputs: x [T, D], gate [E, D], w1 [E, F, D], w2 [E, D, F], w3 [E, F, D]; bias [E] steers the
// choice. Outputs: y [T, D] (routed only) and, with aux_alpha > 0, the loss [1].
struct MoeReference {
  MoeRefDims dims;
  Doubles bias;

  struct Routing {
    Doubles scores, weights;
    std::vector<int32_t> idx;
    kernels::ExpertDispatch disp;
  };

  Routing route(const Doubles& x, const Doubles& gate) const {
    const int64_t t = dims.tokens(), e = dims.p.experts, k = dims.p.top_k;
    Doubles logits(size_t(t * e));
    kernels::ref::linear_forward<double>(logits.data(), x.data(), gate.data(), nullptr, t, dims.d, e);
    Routing r{Doubles(size_t(t * e)), Doubles(size_t(t * k)), std::vector<int32_t>(size_t(t * k)), {}};
    kernels::ref::router_forward<double>(r.scores.data(), r.idx.data(), r.weights.data(), logits.data(),
                                         bias.empty() ? nullptr : bias.data(), t, dims.p);
    Tensor idx = Tensor::empty({t, k}, DType::i32);
    std::copy(r.idx.begin(), r.idx.end(), idx.data<int32_t>());
    r.disp = kernels::moe_sort_by_expert(idx, e);
    return r;
  }

  std::vector<Doubles> forward(const std::vector<Doubles>& in) const {
    const int64_t t = dims.tokens(), e = dims.p.experts, k = dims.p.top_k, m = t * k, d = dims.d, f = dims.f;
    const Routing r = route(in[0], in[1]);
    const int32_t* pos = r.disp.pos.data<int32_t>();
    Doubles xs(size_t(m * d)), h1(size_t(m * f)), h3(size_t(m * f)), act(size_t(m * f)), out(size_t(m * d)),
        y(size_t(t * d));
    kernels::ref::moe_permute_forward<double>(xs.data(), in[0].data(), pos, t, k, d);
    kernels::ref::grouped_matmul_forward<double>(h1.data(), xs.data(), in[2].data(), r.disp.offsets.data(), e, f, d);
    kernels::ref::grouped_matmul_forward<double>(h3.data(), xs.data(), in[4].data(), r.disp.offsets.data(), e, f, d);
    kernels::ref::swiglu_forward<double>(act.data(), h1.data(), h3.data(), m * f);
    kernels::ref::grouped_matmul_forward<double>(out.data(), act.data(), in[3].data(), r.disp.offsets.data(), e, d, f);
    kernels::ref::moe_unpermute_forward<double>(y.data(), out.data(), pos, r.weights.data(), t, k, d);
    std::vector<Doubles> outs = {y};
    if (dims.aux_alpha > 0) {
      outs.push_back({dims.aux_alpha * kernels::ref::router_aux_loss<double>(r.scores.data(), r.idx.data(), dims.batch,
                                                                              dims.seq, dims.p)});
    }
    return outs;
  }

  std::vector<Doubles> backward(const std::vector<Doubles>& in, const std::vector<Doubles>& dout) const {
    const int64_t t = dims.tokens(), e = dims.p.experts, k = dims.p.top_k, m = t * k, d = dims.d, f = dims.f;
    const Routing r = route(in[0], in[1]);
    const int32_t* pos = r.disp.pos.data<int32_t>();
    const int64_t* offs = r.disp.offsets.data();
    // Recompute the forward's intermediates.
    Doubles xs(size_t(m * d)), h1(size_t(m * f)), h3(size_t(m * f)), act(size_t(m * f)), out(size_t(m * d));
    kernels::ref::moe_permute_forward<double>(xs.data(), in[0].data(), pos, t, k, d);
    kernels::ref::grouped_matmul_forward<double>(h1.data(), xs.data(), in[2].data(), offs, e, f, d);
    kernels::ref::grouped_matmul_forward<double>(h3.data(), xs.data(), in[4].data(), offs, e, f, d);
    kernels::ref::swiglu_forward<double>(act.data(), h1.data(), h3.data(), m * f);
    kernels::ref::grouped_matmul_forward<double>(out.data(), act.data(), in[3].data(), offs, e, d, f);

    Doubles dx(in[0].size(), 0.0), dgate(in[1].size(), 0.0), dw1(in[2].size(), 0.0), dw2(in[3].size(), 0.0),
        dw3(in[4].size(), 0.0);
    Doubles dweights(size_t(t * k), 0.0), d_out(size_t(m * d)), d_act(size_t(m * f), 0.0), dh1(size_t(m * f), 0.0),
        dh3(size_t(m * f), 0.0), dxs(size_t(m * d), 0.0);
    kernels::ref::moe_unpermute_backward<double>(d_out.data(), dweights.data(), dout[0].data(), out.data(), pos,
                                                 r.weights.data(), t, k, d);
    kernels::ref::grouped_matmul_backward<double>(d_act.data(), dw2.data(), d_out.data(), act.data(), in[3].data(), offs,
                                                  e, d, f);
    kernels::ref::swiglu_backward<double>(dh1.data(), dh3.data(), d_act.data(), h1.data(), h3.data(), m * f);
    kernels::ref::grouped_matmul_backward<double>(dxs.data(), dw1.data(), dh1.data(), xs.data(), in[2].data(), offs, e,
                                                  f, d);
    kernels::ref::grouped_matmul_backward<double>(dxs.data(), dw3.data(), dh3.data(), xs.data(), in[4].data(), offs, e,
                                                  f, d);
    kernels::ref::moe_permute_backward<double>(dx.data(), dxs.data(), pos, t, k, d);
    Doubles dscores;
    if (dims.aux_alpha > 0) {
      dscores.assign(size_t(t * e), 0.0);
      kernels::ref::router_aux_loss_backward<double>(dscores.data(), dims.aux_alpha * dout[1][0], r.scores.data(),
                                                     r.idx.data(), dims.batch, dims.seq, dims.p);
    }
    Doubles dlogits(size_t(t * e), 0.0);
    kernels::ref::router_backward<double>(dlogits.data(), dweights.data(), dscores.empty() ? nullptr : dscores.data(),
                                          r.scores.data(), r.idx.data(), t, dims.p);
    kernels::ref::linear_backward<double>(dx.data(), dgate.data(), nullptr, dlogits.data(), in[0].data(), in[1].data(),
                                          t, d, e);
    return {dx, dgate, dw1, dw2, dw3};
  }
};

}  // namespace titan::test
