#include "titan/models/deepseek_v3/mtp.h"

#include "titan/autograd/ops.h"
#include "titan/models/mtp_targets.h"
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

void MultiTokenPrediction::run(Transformer& model, const Variable& h0, const Tensor& tokens, const Tensor& positions,
                               const Tensor& targets, AuxLosses& aux) {
  const int64_t b = tokens.size(0), s = tokens.size(1), d = int64_t(size());
  mtp::check_batch("deepseek_v3", targets, b, s, d);
  const double weight = args_.mtp_loss_weight / double(d);
  Variable h = h0;
  for (int64_t k = 1; k <= d; ++k) {
    MtpModule& m = (*this)[size_t(k - 1)];
    nn::UnitScope unit(m);  // a unit of the parallel plan: its block and norms, gathered while it runs
    const mtp::ModuleBatch mine = mtp::module_batch(model, tokens, targets, k);  // this rank's chunks under CP
    h = m.forward(h, model.embed(mine.ids), model.rope_tables(), positions, model.recompute(), &aux);
    mtp::add_module_loss(model, model.head(m.norm.forward(h)), mine.targets, weight, aux);
  }
}

}  // namespace titan::models::deepseek_v3
