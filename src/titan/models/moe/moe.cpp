#include "titan/models/moe/moe.h"

#include <algorithm>
#include <memory>

#include "titan/core/profiler.h"
#include "titan/distributed/async_tensor_parallel.h"
#include "titan/distributed/expert_parallel.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/activation.h"
#include "titan/kernels/cast.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/grouped_matmul.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/moe_router.h"
#include "titan/models/moe/hash_routing.h"

namespace titan::models::moe {

using nn::Init;

namespace {
constexpr double kInitStd = 0.02;  // TorchTitan's std for input-side projections

Tensor activations(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, MemCategory::activations); }
Tensor zeros(const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype, MemCategory::temporaries); }

// dst += src, converting src to dst's dtype (a bf16 activation's gradient, or the f32 one of a
// leaf input).
void accumulate(Tensor& dst, const Tensor& src) {
  if (src.dtype() == dst.dtype()) {
    kernels::axpby(dst, src, 1.0, 1.0);
    return;
  }
  Tensor converted = Tensor::empty(src.shape(), dst.dtype());
  kernels::cast(converted, src);
  kernels::axpby(dst, converted, 1.0, 1.0);
}

// The GEMM operand of a parameter: its bf16 compute copy under mixed precision, else the master.
const Tensor& gemm_operand(const nn::Parameter& p) { return p.compute.defined() ? p.compute : p.var.value(); }

// The sequence of each row of the sorted buffer (pos [N, k]: token t's j-th choice sits at row
// pos[t, j]; tokens come seq_len to a sequence), for the quantized wgrad's token tiles.
std::vector<int64_t> row_sequences(const Tensor& pos, int64_t seq_len) {
  const int64_t n = pos.size(0), k = pos.size(1);
  const int32_t* p = pos.data<int32_t>();
  std::vector<int64_t> seq(size_t(n * k));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) seq[size_t(p[t * k + j])] = t / seq_len;
  return seq;
}
}  // namespace

int64_t MoEArgs::ep_degree() const { return ep ? ep->size() : 1; }

kernels::RouterParams MoEArgs::router_params() const {
  kernels::RouterParams p;
  p.experts = n_routed_experts;
  p.top_k = n_activated_experts;
  p.score = score_func;
  p.n_groups = n_expert_groups;
  p.topk_groups = n_limited_groups;
  p.route_norm = route_norm;
  p.route_scale = route_scale;
  return p;
}

void MoEArgs::validate() const {
  TITAN_CHECK(dim >= 1 && moe_inter_dim >= 1 && n_shared_experts >= 0,
              "moe: dim " + std::to_string(dim) + ", moe_inter_dim " + std::to_string(moe_inter_dim) +
                  ", n_shared_experts " + std::to_string(n_shared_experts),
              "dim and moe_inter_dim must be positive, n_shared_experts >= 0");
  TITAN_CHECK(load_balance_coeff >= 0 && aux_loss_alpha >= 0,
              "moe: negative load_balance_coeff or aux_loss_alpha", "use 0 to disable either");
  const int64_t degree = tp ? tp->size() : 1;
  TITAN_CHECK(degree == 1 || aux_loss_alpha == 0,
              "model.moe_aux_loss_alpha > 0 with tensor parallelism: the sequence-wise balance loss needs whole "
              "sequences, and each tensor-parallel rank routes a piece of them",
              "set model.moe_aux_loss_alpha = 0 (the aux-loss-free bias still balances) or tensor_parallel_degree = 1");
  TITAN_CHECK(!tp_gather || moe_inter_dim % degree == 0,
              "parallelism.tensor_parallel_degree = " + std::to_string(degree) + " does not divide the routed experts' " +
                  std::to_string(moe_inter_dim) + " hidden units (parallelism.moe_tp_scheme = \"gather\" splits them)",
              "use a degree that divides moe_inter_dim, or moe_tp_scheme = \"sequence\"");
  TITAN_CHECK((moe_inter_dim * n_shared_experts) % degree == 0,
              "parallelism.tensor_parallel_degree = " + std::to_string(degree) + " does not divide the shared experts' " +
                  std::to_string(moe_inter_dim * n_shared_experts) + " hidden units",
              "use a degree that divides moe_inter_dim x n_shared_experts");
  TITAN_CHECK(swiglu_limit > 0, "moe: swiglu_limit " + std::to_string(swiglu_limit),
              "use a positive limit (DeepSeek-V4's default is 10), or none");
  TITAN_CHECK(!hash_routing || vocab_size >= 1,
              "moe: a hash_moe layer with vocab_size " + std::to_string(vocab_size),
              "its tid2eid table has one row per token id: pass the vocabulary size");
  const int64_t experts_over = ep_degree();
  TITAN_CHECK(experts_over >= 1 && n_routed_experts % experts_over == 0,
              "parallelism.expert_parallel_degree = " + std::to_string(experts_over) + " does not divide the " +
                  std::to_string(n_routed_experts) + " routed experts",
              "use a degree that divides " + std::to_string(n_routed_experts));
  kernels::check_router_params(router_params());
}

FeedForward::FeedForward(int64_t dim, int64_t hidden, double init_std, double limit)
    : w1(register_module("w1", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(kInitStd)))),
      w2(register_module("w2", std::make_unique<nn::Linear>(hidden, dim, Init::trunc_normal(init_std)))),
      w3(register_module("w3", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(init_std)))),
      swiglu_limit(limit) {}

Variable FeedForward::forward(const Variable& x) const {
  const Variable x3 = w3.forward(x);  // w3 first: the order the TP forms record too
  return w2.forward(autograd::swiglu(w1.forward(x), x3, swiglu_limit));
}

TokenChoiceTopKRouter::TokenChoiceTopKRouter(int64_t dim, int64_t experts, double init_std)
    : gate(register_module("gate", std::make_unique<nn::Linear>(dim, experts, Init::trunc_normal(init_std)))) {
  gate.weight.gemm_weight = false;  // no bf16 copy: the router's GEMM runs in f32
  gate.quantizable = false;          // ... and never quantized
}

GroupedExperts::GroupedExperts(int64_t dim, int64_t hidden, int64_t experts, double init_std)
    : w1(register_parameter("w1", {experts, hidden, dim}, Init::trunc_normal(kInitStd))),
      w2(register_parameter("w2", {experts, dim, hidden}, Init::trunc_normal(init_std))),
      w3(register_parameter("w3", {experts, hidden, dim}, Init::trunc_normal(init_std))) {
  for (nn::Parameter* p : {&w1, &w2, &w3}) p->gemm_weight = p->routed_expert = true;
}

MoE::MoE(const MoEArgs& a, double init_std)
    : router(register_module("router", std::make_unique<TokenChoiceTopKRouter>(a.dim, a.n_routed_experts, init_std))),
      experts(register_module("experts", std::make_unique<GroupedExperts>(
                                             a.dim, a.moe_inter_dim, a.n_routed_experts, init_std))),
      args_(a),
      stats_counts_(size_t(a.n_routed_experts), 0) {
  a.validate();
  if (a.ep_degree() > 1)
    for (nn::Parameter* w : {&experts.w1, &experts.w2, &experts.w3}) distributed::shard_experts(*w, *a.ep);
  if (a.n_shared_experts > 0) {
    shared_experts = &register_module("shared_experts", std::make_unique<FeedForward>(
                                                            a.dim, a.moe_inter_dim * a.n_shared_experts, init_std, a.swiglu_limit));
  }
  if (a.normal_init_std > 0)
    for (auto& [name, p] : named_parameters()) p->init = Init::normal(0, a.normal_init_std);
  // The routing's state: the balancing bias, or hash routing's table. A fresh table spreads the
  // ids evenly, tid2eid[v, j] = (v K + j) mod E (K distinct experts per id when K <= E), so that a
  // model trained from scratch uses every expert: transformers' zeros, there only to be loaded
  // over, would send every token to expert 0 in every slot. A checkpoint brings the real table.
  if (a.hash_routing) {
    tid2eid = Tensor::empty({a.vocab_size, a.n_activated_experts}, DType::i64, MemCategory::parameters);
    int64_t* table = tid2eid.data<int64_t>();
    for (int64_t i = 0; i < tid2eid.numel(); ++i) table[i] = i % a.n_routed_experts;
    register_buffer("tid2eid", tid2eid);
  } else {
    expert_bias = Tensor::zeros({a.n_routed_experts}, DType::f32, MemCategory::parameters);
    register_buffer("expert_bias", expert_bias);
  }
  tokens_per_expert = Tensor::zeros({a.n_routed_experts}, DType::f32, MemCategory::parameters);
  register_buffer("tokens_per_expert", tokens_per_expert, nn::BufferKind::step_statistic);
  warmup_tokens_per_expert = Tensor::zeros({a.n_routed_experts}, DType::f32, MemCategory::parameters);
  register_buffer("warmup_tokens_per_expert", warmup_tokens_per_expert, nn::BufferKind::saved_statistic);
}

MoE::Output MoE::forward_with_aux(const Variable& x, const Tensor& token_ids) {
  ProfileScope prof("moe.fwd");
  const distributed::ProcessGroup* tp = args_.tp && args_.tp->size() > 1 ? args_.tp : nullptr;
  if (!tp) {
    Output o = routed(x, token_ids);
    if (shared_experts) o.y = autograd::add(o.y, shared_experts->forward(x));
    return o;
  }
  const int64_t n = x.shape()[0], d = args_.dim;
  if (args_.tp_gather) {
    // TorchTitan's scheme: every rank routes all tokens alike through its slice of every expert's
    // hidden units; the routed and shared partial sums are reduce-scattered together.
    const Variable all = distributed::gather_tokens(x, *tp);  // [N, D]
    Output o = routed(autograd::view(all, {1, all.shape()[0], d}), token_ids);
    Variable y = autograd::view(o.y, all.shape());
    if (shared_experts) y = autograd::add(y, shared_experts->forward(all));
    o.y = distributed::reduce_scatter_tokens(y, *tp);
    return o;
  }
  // The MoE TP fix: this rank's piece, as one sequence, to whole experts; shared experts TP.
  // Hash routing reads the ids of this rank's tokens: its piece of every rank's ids.
  const Tensor ids = token_ids.defined() ? token_ids.narrow(0, tp->rank() * n, n).contiguous() : Tensor();
  Output o = routed(autograd::view(x, {1, n, d}), ids);
  o.y = autograd::view(o.y, x.shape());
  if (shared_experts) {  // w3 recorded before w1, as shared_experts->forward does
    const FeedForward& f = *shared_experts;
    const std::vector<Variable> up = distributed::column_parallel(x, {&f.w3, &f.w1}, tp, async_tp_);
    o.y = autograd::add(o.y, distributed::row_parallel(autograd::swiglu(up[1], up[0], f.swiglu_limit), f.w2, tp, async_tp_));
  }
  return o;
}

void MoE::set_forms(autograd::OpForm grouped_mm, autograd::OpForm permute) {
  const bool fused = grouped_mm == autograd::OpForm::fused && permute == autograd::OpForm::fused;
  TITAN_CHECK(fused || args_.ep_degree() == 1,
              "model.converters asks for the small-op grouped GEMM or permute with expert parallelism",
              "drop grouped_mm_small_ops / permute_small_ops / small_ops, or set expert_parallel_degree = 1");
  TITAN_CHECK(fused || !quantize_, "model.converters asks for the small-op grouped GEMM or permute with the quantized "
                                    "routed experts (quantize.grouped_mm.float8 / quantize.grouped_mm.mx)",
              "drop grouped_mm_small_ops / permute_small_ops / small_ops from [model] converters: the quantized "
              "experts run on the fused path only (or drop quantize.grouped_mm.*)");
  grouped_mm_form_ = grouped_mm;
  permute_form_ = permute;
}

void MoE::set_quantize(std::optional<autograd::LowPrecision> recipe) {
  if (recipe) {
    const bool fused = grouped_mm_form_ == autograd::OpForm::fused && permute_form_ == autograd::OpForm::fused;
    TITAN_CHECK(fused, "model.converters names quantize.grouped_mm.float8 / quantize.grouped_mm.mx with the small-op "
                       "grouped GEMM or permute (grouped_mm_small_ops / permute_small_ops / small_ops)",
                "drop the small-op converters from [model] converters: the quantized experts run on the fused path only");
    TITAN_CHECK(args_.ep_degree() == 1 && !args_.tp_gather,
                "quantize.grouped_mm.* with expert parallelism or TP's gather scheme is not built",
                "set parallelism.expert_parallel_degree = 1 and tensor_parallel_degree = 1, or drop quantize.grouped_mm.*");
  }
  quantize_ = recipe;
}

void MoE::count_tokens(const kernels::ExpertDispatch& disp) {
  // Training forwards only: evaluation runs without grad, and under activation checkpointing
  // the first pass does too, so its recompute (the same choice: the bias has not moved yet)
  // counts each step once.
  if (!autograd::grad_enabled()) return;
  float* tpe = tokens_per_expert.data<float>();
  for (int64_t i = 0; i < int64_t(stats_counts_.size()); ++i)
    tpe[i] += float(disp.tokens_of(i)), stats_counts_[size_t(i)] += disp.tokens_of(i);
}

void MoE::route(Tensor& scores, Tensor& idx, Tensor& weights, const Tensor& logits, const Tensor& token_ids) const {
  const kernels::RouterParams rp = args_.router_params();
  if (!args_.hash_routing) {
    kernels::moe_router_forward(scores, idx, weights, logits, expert_bias, rp);
    return;
  }
  idx = hash_choice(tid2eid, token_ids, logits.size(0), rp.experts);
  kernels::moe_router_weights_forward(scores, weights, logits, idx, rp);
}

MoE::Output MoE::routed_composed(const Variable& x, const Tensor& token_ids) {
  using autograd::OpForm;
  const int64_t batch = x.shape()[0], t = x.shape()[0] * x.shape()[1], d = args_.dim;
  const kernels::RouterParams rp = args_.router_params();
  const int64_t e = rp.experts, k = rp.top_k;
  const double alpha = args_.aux_loss_alpha;
  // The router, as routed() runs it, as one op: x [T, D] f32 -> the gate weights [T, k] (and the
  // balance loss); the choice itself (idx, the dispatch) has no gradient.
  const Variable xf = autograd::cast(autograd::view(x, {t, d}), DType::f32);  // [T, D]
  const Tensor& gate_w = router.gate.weight.var.value();                      // [E, D] f32
  Tensor logits = Tensor::empty({t, e}, DType::f32);
  kernels::linear_forward(logits, xf.value(), gate_w);
  Tensor scores = activations({t, e}, DType::f32), idx = activations({t, k}, DType::i32),
         gate_weights = activations({t, k}, DType::f32);
  route(scores, idx, gate_weights, logits, token_ids);
  const kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, e);
  count_tokens(disp);
  std::vector<Tensor> router_out = {gate_weights};
  if (alpha > 0) router_out.push_back(Tensor::full({1}, alpha * kernels::moe_aux_loss_forward(scores, idx, batch, rp), DType::f32));
  const std::vector<Variable> routing = autograd::record(
      "moe_router", {xf, router.gate.weight.var}, router_out,
      [=, xv = xf.value()](std::span<const Tensor> dout, autograd::GradSink& g) {
        const Tensor dweights = dout[0].defined() ? dout[0].contiguous() : zeros({t, k}, DType::f32);
        Tensor dscores;
        if (alpha > 0 && dout.size() > 1 && dout[1].defined()) {
          dscores = zeros({t, e}, DType::f32);
          kernels::moe_aux_loss_backward(dscores, alpha * dout[1].item(), scores, idx, batch, rp);
        }
        Tensor dlogits = zeros({t, e}, DType::f32);  // [T, E]
        kernels::moe_router_backward(dlogits, dweights, dscores, scores, idx, rp);
        Tensor dx = g.grad(0), dgate = g.grad(1), no_bias;
        kernels::linear_backward(dx, dgate, no_bias, dlogits, xv, gate_w);
      });

  const bool small_permute = permute_form_ == OpForm::small_ops;
  auto gemm = [&](const Variable& a, const nn::Parameter& w) {
    return grouped_mm_form_ == OpForm::fused ? autograd::grouped_matmul(a, w.var, disp.offsets)
                                             : autograd::grouped_matmul_small_ops(a, w.var, disp.offsets);
  };
  const Variable xs = small_permute ? autograd::moe_permute_small_ops(xf, disp.pos) : autograd::moe_permute(xf, disp.pos);  // [M, D]
  const Variable act = autograd::swiglu(gemm(xs, experts.w1), gemm(xs, experts.w3), args_.swiglu_limit);  // [M, F]
  const Variable out = gemm(act, experts.w2);                                        // [M, D]
  const Variable y = small_permute ? autograd::moe_unpermute_small_ops(out, disp.pos, routing[0])
                                   : autograd::moe_unpermute(out, disp.pos, routing[0]);  // [T, D]
  return {autograd::cast(autograd::view(y, x.shape()), x.dtype()), alpha > 0 ? routing[1] : Variable()};
}

MoE::Output MoE::routed(const Variable& x, const Tensor& token_ids) {
  TITAN_CHECK(x.shape().size() == 3 && x.shape()[2] == args_.dim,
              "moe: input " + x.shape().str() + " for dim " + std::to_string(args_.dim), "pass x as [B, S, D]");
  if (grouped_mm_form_ != autograd::OpForm::fused || permute_form_ != autograd::OpForm::fused) return routed_composed(x, token_ids);
  // f: the experts' hidden units this rank holds (a 1/tp slice under TP's gather scheme).
  const int64_t batch = x.shape()[0], t = x.shape()[0] * x.shape()[1], d = args_.dim, f = experts.w1.var.shape()[1];
  const DType cd = x.dtype();
  const kernels::RouterParams rp = args_.router_params();
  const int64_t e = rp.experts, k = rp.top_k, m = t * k;
  const double limit = args_.swiglu_limit;  // the experts' SwiGLU clamp (DeepSeek-V4), or none
  const Tensor xv = x.value().view({t, d});  // [T, D]

  // Router in f32 whatever the compute dtype: xf [T, D], logits [T, E].
  Tensor xf = xv;
  if (cd != DType::f32) {
    xf = activations({t, d}, DType::f32);
    kernels::cast(xf, xv);
  }
  const Tensor& gate_w = router.gate.weight.var.value();  // [E, D] f32
  Tensor logits = Tensor::empty({t, e}, DType::f32);
  kernels::linear_forward(logits, xf, gate_w);
  // scores [T, E]; idx, weights [T, k]: the chosen experts and their gate weights
  Tensor scores = activations({t, e}, DType::f32), idx = activations({t, k}, DType::i32),
         weights = activations({t, k}, DType::f32);
  route(scores, idx, weights, logits, token_ids);

  kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, e);
  count_tokens(disp);

  const Tensor &w1 = gemm_operand(experts.w1), &w2 = gemm_operand(experts.w2), &w3 = gemm_operand(experts.w3);
  Tensor xs = activations({m, d}, cd);  // [M, D] tokens sorted by expert
  kernels::moe_permute_forward(xs, xv, disp.pos);
  // The rows this rank's experts run: its own (xe = xs), or under EP those every rank of the
  // group routed to them, [R, D] by local expert (offsets: per local expert).
  const distributed::ProcessGroup* ep = args_.ep_degree() > 1 ? args_.ep : nullptr;
  std::shared_ptr<const distributed::ExpertExchange> exchange;
  if (ep) exchange = std::make_shared<const distributed::ExpertExchange>(disp.offsets, *ep);
  const Tensor xe = ep ? exchange->dispatch(xs) : xs;
  const std::vector<int64_t>& offsets = ep ? exchange->local_offsets() : disp.offsets;
  const int64_t r = xe.shape()[0];
  Tensor h1 = activations({r, f}, cd), h3 = activations({r, f}, cd), act = activations({r, f}, cd);  // [R, F]
  Tensor out_e = activations({r, d}, cd);  // [R, D] expert outputs
  // Under quantize.grouped_mm.*: the weights' per-step forms, the forward operands' quantized
  // rows (kept for wgrad) and wgrad's token tile starts (each expert's and each sequence's first row).
  const std::optional<autograd::LowPrecision> recipe = quantize_;
  autograd::QuantizedRows xq, actq;
  std::vector<int64_t> tile_starts;
  {
    ProfileScope prof_experts("moe.experts.fwd");  // the grouped GEMMs' share of the layer
    if (recipe) {
      quantized_w1_.refresh(w1, *recipe), quantized_w2_.refresh(w2, *recipe), quantized_w3_.refresh(w3, *recipe);
      xq = autograd::quantize_activation_rows(xe, *recipe);
      autograd::quantized_grouped_forward(h1, xq, quantized_w1_, offsets);
      autograd::quantized_grouped_forward(h3, xq, quantized_w3_, offsets);
      kernels::swiglu_forward(act, h1, h3, limit);
      actq = autograd::quantize_activation_rows(act, *recipe);
      autograd::quantized_grouped_forward(out_e, actq, quantized_w2_, offsets);
      tile_starts = autograd::token_tile_starts(offsets, row_sequences(disp.pos, x.shape()[1]));
    } else {
      kernels::grouped_matmul_forward(h1, xe, w1, offsets);
      kernels::grouped_matmul_forward(h3, xe, w3, offsets);
      kernels::swiglu_forward(act, h1, h3, limit);
      kernels::grouped_matmul_forward(out_e, act, w2, offsets);
    }
  }
  const Tensor out = ep ? exchange->combine(out_e) : out_e;  // [M, D], by expert, at their tokens' rank
  Tensor y = activations({batch, x.shape()[1], d}, cd);  // [B, S, D]
  Tensor y2 = y.view({t, d});
  kernels::moe_unpermute_forward(y2, out, disp.pos, weights);

  const double alpha = args_.aux_loss_alpha;
  std::vector<Tensor> outputs = {y};
  if (alpha > 0) {
    outputs.push_back(Tensor::full({1}, alpha * kernels::moe_aux_loss_forward(scores, idx, batch, rp), DType::f32));
  }
  const std::vector<Variable> vars = autograd::record(
      "moe", {x, router.gate.weight.var, experts.w1.var, experts.w2.var, experts.w3.var}, outputs,
      [=, pos = disp.pos, offsets = offsets, qw1 = &quantized_w1_, qw2 = &quantized_w2_, qw3 = &quantized_w3_](
          std::span<const Tensor> dout, autograd::GradSink& g) {
        ProfileScope prof_bwd("moe.bwd");
        Tensor dweights = zeros({t, k}, DType::f32);  // [T, k]
        // Under EP every rank's backward runs the exchanges, in step with the others'.
        const Tensor dy = dout[0].defined() || !ep ? dout[0] : zeros({t, d}, cd);
        if (dy.defined()) {
          // Combine: d(expert outputs) [M, D] and the gate weights' gradient.
          Tensor d_out = Tensor::empty({m, d}, cd);  // [M, D]
          kernels::moe_unpermute_backward(d_out, dweights, dy.view({t, d}), out, pos, weights);
          const Tensor d_out_e = ep ? exchange->dispatch(d_out) : d_out;  // [R, D]
          // Fresh buffers, written before they are read: the first product into each writes.
          // Under EP the rows' gradients go back to their ranks whatever this rank needs.
          Tensor dxe = g.needs(0) || ep ? Tensor::empty({r, d}, cd, MemCategory::temporaries) : Tensor();  // [R, D]
          {
            ProfileScope prof_experts("moe.experts.bwd");
            Tensor d_act = Tensor::empty({r, f}, cd, MemCategory::temporaries);  // [R, F]
            // The expert weights' gradients are written outright after zero_grad (grad_to_write).
            bool acc_w1 = true, acc_w2 = true, acc_w3 = true;
            const Tensor dw1 = g.grad_to_write(2, &acc_w1), dw2 = g.grad_to_write(3, &acc_w2),
                         dw3 = g.grad_to_write(4, &acc_w3);
            Tensor dh1 = Tensor::empty({r, f}, cd, MemCategory::temporaries);  // [R, F]
            Tensor dh3 = Tensor::empty({r, f}, cd, MemCategory::temporaries);
            if (recipe) {
              autograd::quantized_grouped_backward(d_act, dw2, d_out_e, actq, *qw2, offsets, tile_starts, acc_w2, false);
              kernels::swiglu_backward(dh1, dh3, d_act, h1, h3, false, limit);
              autograd::quantized_grouped_backward(dxe, dw1, dh1, xq, *qw1, offsets, tile_starts, acc_w1, false);
              autograd::quantized_grouped_backward(dxe, dw3, dh3, xq, *qw3, offsets, tile_starts, acc_w3, true);
            } else {
              kernels::grouped_matmul_backward(d_act, dw2, d_out_e, act, w2, offsets, acc_w2, false);
              kernels::swiglu_backward(dh1, dh3, d_act, h1, h3, false, limit);
              kernels::grouped_matmul_backward(dxe, dw1, dh1, xe, w1, offsets, acc_w1, false);
              kernels::grouped_matmul_backward(dxe, dw3, dh3, xe, w3, offsets, acc_w3);
            }
          }
          const Tensor dxs = ep ? exchange->combine(dxe) : dxe;  // [M, D]
          if (g.needs(0)) {
            Tensor dx = g.grad(0).view({t, d});  // [T, D]
            if (dx.dtype() == cd) {
              kernels::moe_permute_backward(dx, dxs, pos);
            } else {
              Tensor dx_routed = zeros({t, d}, cd);  // [T, D]
              kernels::moe_permute_backward(dx_routed, dxs, pos);
              accumulate(dx, dx_routed);
            }
          }
        }
        Tensor dscores;  // [T, E], the balance loss's gradient on the scores
        if (alpha > 0 && dout.size() > 1 && dout[1].defined()) {
          dscores = zeros({t, e}, DType::f32);
          kernels::moe_aux_loss_backward(dscores, alpha * dout[1].item(), scores, idx, batch, rp);
        }
        // Router: the choice is discrete, so gradients reach the logits only through the gate
        // weights (and the balance loss), then the f32 gate GEMM.
        Tensor dlogits = zeros({t, e}, DType::f32);  // [T, E]
        kernels::moe_router_backward(dlogits, dweights, dscores, scores, idx, rp);
        Tensor dxf = g.needs(0) ? zeros({t, d}, DType::f32) : Tensor(), no_bias;  // [T, D] f32
        Tensor dgate = g.grad(1);  // [E, D] f32
        kernels::linear_backward(dxf, dgate, no_bias, dlogits, xf, gate_w);
        if (g.needs(0)) {
          Tensor dx = g.grad(0).view({t, d});  // [T, D]
          accumulate(dx, dxf);
        }
      });
  return {vars[0], alpha > 0 ? vars[1] : Variable()};
}

void MoE::update_load_balance() {
  const int64_t e = args_.n_routed_experts;
  float* counts = tokens_per_expert.data<float>();
  if (args_.load_balance_coeff > 0 && expert_bias.defined()) {
    double mean = 0;
    for (int64_t i = 0; i < e; ++i) mean += counts[i];
    mean /= double(e);
    // Underloaded experts (below the mean) get a higher bias, overloaded ones a lower; the
    // shift to zero mean keeps the bias from drifting (only differences steer the choice).
    std::vector<double> delta(static_cast<size_t>(e));
    double delta_mean = 0;
    for (int64_t i = 0; i < e; ++i) {
      const double dev = mean - counts[i];
      delta[size_t(i)] = args_.load_balance_coeff * double((dev > 0) - (dev < 0));
      delta_mean += delta[size_t(i)];
    }
    delta_mean /= double(e);
    float* bias = expert_bias.data<float>();
    for (int64_t i = 0; i < e; ++i) bias[i] = float(double(bias[i]) + delta[size_t(i)] - delta_mean);
  }
  tokens_per_expert.zero_();
}

ExpertLoad MoE::load_stats() {
  ExpertLoad s;
  const auto [lo, hi] = std::minmax_element(stats_counts_.begin(), stats_counts_.end());
  for (int64_t c : stats_counts_) s.tokens += c;
  s.min = double(*lo), s.max = double(*hi);
  const double mean = double(s.tokens) / double(stats_counts_.size());
  s.imbalance = mean > 0 ? s.max / mean : 0;
  std::fill(stats_counts_.begin(), stats_counts_.end(), 0);
  return s;
}

namespace {
void add_into(Tensor& dst, const Tensor& src) {
  float* d = dst.data<float>();
  const float* x = src.data<float>();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += x[i];
}
}  // namespace

// Counts are whole numbers below 2^24, so summing each step over the ranks and then over the steps
// gives the same floats as the other order.
void MoE::end_step(const SumOverData& sum_over_data) {
  sum_over_data(tokens_per_expert);
  add_into(tokens_per_expert, warmup_tokens_per_expert);
  warmup_tokens_per_expert.zero_();
  update_load_balance();
}

void MoE::end_frozen_step(const SumOverData& sum_over_data) {
  sum_over_data(tokens_per_expert);
  add_into(warmup_tokens_per_expert, tokens_per_expert);
  tokens_per_expert.zero_();
}

void append_load_stats(StepStats& stats, int layer, const ExpertLoad& load) {
  const std::string suffix = "/layer" + std::to_string(layer);
  stats.detail.emplace_back("moe_imbalance" + suffix, load.imbalance);
  stats.detail.emplace_back("moe_load_min" + suffix, load.min);
  stats.detail.emplace_back("moe_load_max" + suffix, load.max);
  const auto max = std::find_if(stats.summary.begin(), stats.summary.end(),
                                [](const auto& kv) { return kv.first == "moe_imbalance_max"; });
  if (max == stats.summary.end()) stats.summary.emplace_back("moe_imbalance_max", load.imbalance);
  else max->second = std::max(max->second, load.imbalance);
}

Variable MoE::forward(const Variable& x, AuxLosses* aux) {
  Output o = forward_with_aux(x);
  if (aux && o.aux_loss.defined()) aux->push_back({"moe_aux_loss", o.aux_loss, o.aux_loss.value().item(), false});
  return o.y;
}

}  // namespace titan::models::moe
