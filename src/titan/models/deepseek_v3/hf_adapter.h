// Hugging Face interop for DeepSeek-V3: config.json <-> DeepSeekV3Args, and weight names and
// shapes between HF's layout ("model.layers.3.self_attn.kv_b_proj.weight", one matrix per expert)
// and ours (TorchTitan v0.2's: "layers.3.attention.wkv_b.weight", experts stacked [E, ...]).
//
//   model.embed_tokens.weight                      tok_embeddings.weight
//   model.layers.L.self_attn.q_proj                layers.L.attention.wq          (q_lora_rank 0)
//   model.layers.L.self_attn.q_a_proj / q_a_layernorm / q_b_proj   attention.wq_a / q_norm / wq_b
//   model.layers.L.self_attn.kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj / o_proj
//                                                  attention.wkv_a / kv_norm / wkv_b / wo
//   model.layers.L.input_layernorm / post_attention_layernorm      attention_norm / ffn_norm
//   model.layers.L.mlp.{gate,up,down}_proj         feed_forward.w1 / w3 / w2      (dense layers)
//   model.layers.L.mlp.gate.weight                 moe.router.gate.weight
//   model.layers.L.mlp.gate.e_score_correction_bias   moe.expert_bias
//   model.layers.L.mlp.shared_experts.{gate,up,down}_proj   moe.shared_experts.w1 / w3 / w2
//   model.layers.L.mlp.experts.E.{gate,up,down}_proj        moe.experts.w1 / w3 / w2 [E] (stacked)
//   model.norm.weight / lm_head.weight             norm.weight / output.weight
//   model.layers.L.self_attn.indexer.{wq_b, wk, k_norm, weights_proj}   attention.indexer.<same>
//                                                  (DeepSeek-V3.2 only; k_norm has weight and bias)
//
// DeepSeek-V3.2 (model_type "deepseek_v32", DeepseekV32ForCausalLM) is DeepSeek-V3 plus the
// lightning indexer in every layer: config keys index_n_heads / index_head_dim / index_topk map to
// the args fields of the same names (index_n_heads = 0 means V3), and index_hadamard, our own key
// (the Hadamard rotation leaves index scores unchanged, so HF has none), defaults to true.
// transformers' mlp_layer_types (dense prefix, then "sparse" = MoE) sets n_dense_layers when
// present. The indexer's RoPE (rotate-half on its first qk_rope_head_dim dims) is fixed by the
// architecture, so its weights also map unpermuted. Checked against transformers 5.24's
// deepseek_v32: same names and shapes, LayerNorm k_norm (eps 1e-6), weights scaled by
// index_n_heads^-0.5 and the scores by index_head_dim^-0.5 (one product, as in ours), q from
// q_a_layernorm's output; HF's indexer runs without gradient (inference only) and skips the
// Hadamard; its router is always sigmoid.
// RoPE: HF's DeepSeek-V3 (rope_interleave = true, the default and what DeepSeek's checkpoints
// need) rotates interleaved pairs, as our MLA does, so weights map without any permutation.
// MTP (num_nextn_predict_layers = D > 0; mtp.h): module K is HF's layer n_layers + K,
//   model.layers.<n_layers + K>.{enorm, hnorm, eh_proj}       mtp.K.{enorm, hnorm, eh_proj}
//   model.layers.<n_layers + K>.shared_head.norm              mtp.K.norm
//   model.layers.<n_layers + K>.<the layer names above>       mtp.K.block.<ours above>
// and its embed_tokens / shared_head.head (copies of the shared embedding and lm_head in
// DeepSeek's checkpoint) are skipped on load and written as copies on export. With D = 0 any
// layer >= n_layers is skipped on load (a checkpoint's MTP weights are then unused). A folder
// that transformers saved says D = 1 but holds no MTP layer: args_from_hf_folder then reads D = 0.
// Norm eps: HF's q_a/kv_a latent norms hard-code 1e-6 while rms_norm_eps sets the others; ours
// use norm_eps for all. DeepSeek's configs set 1e-6, so their checkpoints match exactly (checked:
// our export of a 1e-6 model loads in transformers with no missing or unexpected keys, the MoE
// layout included, and reproduces our logits to 3e-8); exporting a flavor with TorchTitan's
// 1e-5 gives HF a 1e-5 / 1e-6 mix (logits differ by ~1e-4).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.h"
#include "titan/models/deepseek_v3/model.h"

namespace titan::models::deepseek_v3 {

// config.json -> args (V3 or V3.2). Checks model_type and the features we do not implement (biases,
// tied embeddings, GQA, non-interleaved RoPE, unequal YaRN mscales, a V3.2 indexer without query
// latent); errors name the key and `source`.
DeepSeekV3Args args_from_hf_config(const nlohmann::json& config, const std::string& source);
// args -> config.json in the layout of DeepSeek's published configs (V3.2's when args has an indexer).
// num_nextn_predict_layers is a.num_mtp_layers: the MTP layers the folder is given weights for.
nlohmann::json hf_config_from_args(const DeepSeekV3Args& a);

// The args of an HF folder: its config.json's, with num_mtp_layers lowered to the MTP layers the
// folder holds weights for. DeepSeek's hub checkpoints hold all num_nextn_predict_layers of them
// (model.layers.<n_layers + K>.*), but transformers' save_pretrained writes none (its
// DeepseekV3ForCausalLM has no MTP module) while config.json keeps num_nextn_predict_layers
// (DeepseekV3Config's default is 1). An MTP layer counts as present when any tensor is named
// after it (an incomplete one is then an error at load); a present layer after an absent one is
// an error. When lowered, `note` (if given) gets one line saying so and what training does then.
DeepSeekV3Args args_from_hf_folder(const checkpoint::HfFolder& folder, std::string* note = nullptr);

// Our state (parameters and buffers) for the full architecture of `a` in registration order:
// MoE layers with router, stacked experts, shared experts and the expert bias; the indexer's
// weights after attention.wo when a.has_indexer().
std::vector<std::pair<std::string, Shape>> state_shapes(const DeepSeekV3Args& a);

// The HF tensors our `name` comes from: one, or one per expert for stacked expert weights.
// Throws for a name that has no HF counterpart.
std::vector<std::string> hf_names(const std::string& name, const DeepSeekV3Args& a);

// Reads `wanted` (our names and shapes) from an HF folder as f32 (dequantizing fp8), stacking
// experts. Errors name the HF tensor, its file and both shapes. With `strict`, every HF tensor
// must be consumed (other than fp8 scales, the MTP layers' shared copies and layers past
// n_layers + num_mtp_layers).
std::map<std::string, Tensor> load_hf_state(const checkpoint::HfFolder& folder, const DeepSeekV3Args& a,
                                            const std::vector<std::pair<std::string, Shape>>& wanted,
                                            bool strict = true);

// Builds the model an HF folder describes (args_from_hf_folder: MTP modules only for the MTP
// layers it has weights for) and loads its weights. Without a MoE factory the checkpoint must be
// all-dense (first_k_dense_replace >= num_hidden_layers + its MTP layers).
std::unique_ptr<Transformer> load_hf_model(const std::filesystem::path& dir, const MoeFactory& moe = {});

// Our state -> HF names and layout (experts unstacked), in our order.
std::vector<std::pair<std::string, Tensor>> to_hf_tensors(const std::vector<std::pair<std::string, Tensor>>& state,
                                                          const DeepSeekV3Args& a);
// Writes an HF folder (config.json + shards + index) for our state.
void save_hf(const std::filesystem::path& dir, const DeepSeekV3Args& a,
             const std::vector<std::pair<std::string, Tensor>>& state, const checkpoint::HfWriteOptions& options = {});

}  // namespace titan::models::deepseek_v3
