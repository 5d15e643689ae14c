#include "titan/models/deepseek_v4/moe.h"

namespace titan::models::deepseek_v4 {

models::moe::MoEArgs moe_args(const DeepSeekV4Args& a, int64_t layer, const models::moe::MoEArgs& groups) {
  models::moe::MoEArgs m;
  m.dim = a.dim, m.moe_inter_dim = a.moe_inter_dim, m.n_routed_experts = a.n_routed_experts;
  m.n_shared_experts = 1;  // of width F
  m.n_activated_experts = a.n_activated_experts;
  m.score_func = a.score_func;
  m.route_norm = true;  // transformers always renormalises (norm_topk_prob is ignored)
  m.route_scale = a.route_scale;
  m.swiglu_limit = a.swiglu_limit;
  m.hash_routing = a.mlp_types.at(size_t(layer)) == MlpType::hash_moe;
  m.vocab_size = a.vocab_size;
  m.load_balance_coeff = m.hash_routing ? 0 : a.load_balance_coeff;
  m.aux_loss_alpha = 0;  // family.cpp refuses model.moe_aux_loss_alpha > 0
  m.normal_init_std = a.init_std;
  m.ep = groups.ep, m.tp = groups.tp, m.tp_gather = groups.tp_gather;
  return m;
}

}  // namespace titan::models::deepseek_v4
