// Llama-3 model arguments and the named flavors (TorchTitan's shapes plus our 125M).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "titan/kernels/rope.h"

namespace titan::models::llama3 {

struct Llama3Args {
  int64_t dim = 256;
  int64_t n_layers = 6;
  int64_t n_heads = 16;
  int64_t n_kv_heads = 0;  // 0: n_heads (no GQA)
  int64_t vocab_size = 2048;
  int64_t multiple_of = 256;  // the FFN hidden size is rounded up to a multiple of this
  std::optional<double> ffn_dim_multiplier;
  double norm_eps = 1e-5;
  double rope_theta = 500000;
  bool rope_llama3_scaling = true;  // Llama 3.1's frequency scaling (factor 8, low 1, high 4, 8192)
  int64_t max_seq_len = 2048;       // RoPE table length
  bool tie_embeddings = false;
  bool depth_init = true;           // output projections' init std shrinks with depth (TorchTitan)

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return dim / n_heads; }
  // Llama's rule: 2/3 of 4*dim, times the multiplier, rounded up to multiple_of.
  int64_t ffn_hidden() const;
  kernels::RopeConfig rope() const;
  // Parameters, all or without the embedding table (TorchTitan's FLOP count excludes it).
  int64_t num_parameters(bool include_embedding = true) const;
  // Training FLOPs per token, as TorchTitan counts them: 6 * (params - embedding) + 12 * L * H * Dh * S.
  double training_flops_per_token(int64_t seq_len) const;
  void validate() const;  // throws naming the field when the shapes do not fit together
};

// Flavors: "debugmodel", "125M", "8B", "70B", "405B". vocab_size comes from the tokenizer (the
// flavor's own is used when vocab_size <= 0). Throws, listing the flavors, for an unknown name.
Llama3Args llama3_flavor(const std::string& flavor, int64_t vocab_size = 0);
std::vector<std::string> llama3_flavor_names();

}  // namespace titan::models::llama3
