#include "titan/models/deepseek_v3/mtp.h"

#include <optional>
#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/distributed/context_parallel.h"
#include "titan/nn/module.h"

namespace titan::models::deepseek_v3 {

using nn::Init;

MtpModule::MtpModule(const DeepSeekV3Args& a, int depth, const MoeFactory& moe, const distributed::ProcessGroup* tp)
    : enorm(register_module("enorm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      hnorm(register_module("hnorm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      eh_proj(register_module("eh_proj", std::make_unique<nn::Linear>(2 * a.dim, a.dim,
                                                                      Init::trunc_normal(DeepSeekV3Args::kInitStd)))),
      block(register_module("block", std::make_unique<TransformerBlock>(a, int(a.n_layers) + depth, moe, tp))),
      norm(register_module("norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))) {}

Variable MtpModule::forward(const Variable& h_prev, const Variable& emb, const kernels::RopeTables& rope,
                            const Tensor& positions, Recompute recompute, AuxLosses* aux) {
  const Variable x = eh_proj.forward(autograd::concat_last(enorm.forward(emb), hnorm.forward(h_prev)));  // [B, S, D]
  return block.forward(x, rope, positions, recompute, aux);
}

MultiTokenPrediction::MultiTokenPrediction(const DeepSeekV3Args& a, const MoeFactory& moe,
                                           const distributed::ProcessGroup* tp)
    : args_(a) {
  for (int k = 0; k < a.num_mtp_layers; ++k) append(std::make_unique<MtpModule>(a, k, moe, tp));
}

Tensor MultiTokenPrediction::shifted_tokens(const Tensor& tokens, int64_t k) {
  const int64_t b = tokens.size(0), s = tokens.size(1);
  Tensor out = Tensor::empty({b, s}, DType::i32, MemCategory::activations);
  const int32_t* in = tokens.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  // Past the row any valid id does: those positions have no target, and causal attention keeps
  // them from reaching the earlier ones.
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < s; ++i) o[r * s + i] = i + k < s ? in[r * s + i + k] : 0;
  return out;
}

Tensor MultiTokenPrediction::shifted_targets(const Tensor& targets, int64_t batch, int64_t seq, int64_t k) {
  Tensor out = Tensor::empty({batch * seq}, DType::i32, MemCategory::activations);
  const int32_t* in = targets.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t i = 0; i < seq; ++i) o[r * seq + i] = i + k < seq ? in[r * seq + i + k] : -100;
  return out;
}

void MultiTokenPrediction::run(Transformer& model, const Variable& h0, const Tensor& tokens, const Tensor& positions,
                               const Tensor& targets, AuxLosses& aux) {
  const int64_t b = tokens.size(0), s = tokens.size(1), d = int64_t(size());
  TITAN_CHECK(targets.dtype() == DType::i32 && targets.numel() == b * s,
              "deepseek_v3 MTP: the targets must be i32 with one entry per token (" + std::to_string(b * s) +
                  "), got " + targets.str(),
              "pass the [B*S] targets of the tokens given to the forward");
  TITAN_CHECK(s > d, "deepseek_v3 MTP: a sequence of " + std::to_string(s) + " tokens leaves no target for module " +
                         std::to_string(d) + " (it predicts " + std::to_string(d + 1) + " tokens ahead)",
              "train with seq_len > num_mtp_layers");
  // Under CP the shifted tokens and targets are cut into this rank's chunks (tokens[i + k] of a
  // chunk's last positions lie in the next chunk, which every CP rank holds: it reads whole rows).
  const distributed::ProcessGroup* cp = model.context_parallel();
  const std::optional<distributed::CpLayout> layout =
      cp ? std::optional(distributed::cp_layout(*cp, s)) : std::nullopt;
  const auto mine = [&](const Tensor& x) { return layout ? distributed::local_chunks(x, *layout) : x; };  // [B, S] -> [B, L]
  const double weight = args_.mtp_loss_weight / double(d);
  Variable h = h0;
  for (int64_t k = 1; k <= d; ++k) {
    MtpModule& m = (*this)[size_t(k - 1)];
    nn::UnitScope unit(m);  // a unit of the parallel plan: its block and norms, gathered while it runs
    const Variable emb = model.embed(mine(shifted_tokens(tokens, k)));
    h = m.forward(h, emb, model.rope_tables(), positions, model.recompute(), &aux);
    const Tensor tk = mine(shifted_targets(targets, b, s, k).view({b, s}));
    const Tensor tk_flat = tk.view({tk.numel()});
    Variable lk = model.next_token_loss(model.head(m.norm.forward(h)), tk_flat);  // loss parallel under TP
    double value = 0;
    if (cp) std::tie(lk, value) = distributed::mean_over_sequences(lk, tk_flat, *cp);
    else value = lk.value().item();
    aux.push_back({"mtp_loss", autograd::scale(lk, weight), value, true});  // the metric: the mean of the L_k
  }
}

}  // namespace titan::models::deepseek_v3
