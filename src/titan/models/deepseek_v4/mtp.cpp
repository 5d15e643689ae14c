#include "titan/models/deepseek_v4/mtp.h"

#include "titan/autograd/ops.h"
#include "titan/models/deepseek_v4/mixed_linear.h"
#include "titan/models/mtp_targets.h"

namespace titan::models::deepseek_v4 {

DeepSeekV4Args with_mtp_layers(DeepSeekV4Args a) {
  for (int64_t k = 0; k < a.num_mtp_layers; ++k) {
    a.layer_types.push_back(LayerType::sliding);
    a.mlp_types.push_back(MlpType::moe);
  }
  return a;
}

MtpModule::MtpModule(const DeepSeekV4Args& a, int64_t depth, const models::moe::MoEArgs& moe)
    : DecoderLayer(with_mtp_layers(a), a.n_layers + depth, moe),
      e_proj(register_module("e_proj", std::make_unique<nn::Linear>(a.dim, a.dim, nn::Init::normal(0, a.init_std)))),
      h_proj(register_module("h_proj", std::make_unique<nn::Linear>(a.dim, a.dim, nn::Init::normal(0, a.init_std)))),
      enorm(register_module("enorm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      hnorm(register_module("hnorm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      hc_head(register_module("hc_head", std::make_unique<HyperHead>(a.hyper_connection()))),
      norm(register_module("norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))) {}

Variable MtpModule::forward(const Variable& prev, const Variable& emb, const Tensor& positions, const Tensor& ids,
                            const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux) {
  const Shape& shape = prev.shape();  // [T, N, d]
  const int64_t t = shape[0], n = shape[1], d = shape[2];
  // hnorm and h_proj act on each stream's row alone: the streams as T N rows of d.
  const Variable h = mixed_linear(h_proj, hnorm.forward(autograd::view(prev, {t * n, d})));
  const Variable e = mixed_linear(e_proj, enorm.forward(emb));  // [T, d]
  const Variable x = autograd::add(copy_into_streams(e, n), autograd::view(h, {t, n, d}));
  return forward_in_unit(x, positions, ids, rope, recompute, aux);
}

Variable MtpModule::final_rows(const Variable& streams) const { return norm.forward(hc_head.forward(streams)); }

MultiTokenPrediction::MultiTokenPrediction(const DeepSeekV4Args& a, const models::moe::MoEArgs& moe)
    : weight_(a.mtp_loss_weight / double(a.num_mtp_layers)) {
  for (int64_t k = 0; k < a.num_mtp_layers; ++k) append(std::make_unique<MtpModule>(a, k, moe));
}

void MultiTokenPrediction::run(Transformer& model, const Variable& streams, const Tensor& tokens,
                               const Tensor& positions, const Tensor& targets, AuxLosses& aux) {
  const int64_t depth = int64_t(size());
  mtp::check_batch("deepseek_v4", targets, tokens.size(0), tokens.size(1), depth);
  Variable x = streams;
  for (int64_t k = 1; k <= depth; ++k) {
    MtpModule& m = (*this)[size_t(k - 1)];
    nn::UnitScope unit(m);  // a unit of the parallel plan: gathered while it runs
    const mtp::ModuleBatch mine = mtp::module_batch(model, tokens, targets, k);  // t_{i+k}; this rank's chunks under CP
    x = m.forward(x, model.token_embedding(mine.ids), positions, mine.ids.contiguous().view({mine.ids.numel()}),
                  model.sliding_rope(), model.recompute(), &aux);
    mtp::add_module_loss(model, model.output(m.final_rows(x)), mine.targets, weight_, aux);
  }
}

}  // namespace titan::models::deepseek_v4
