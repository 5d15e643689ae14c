// Names of Llama-3 parameters in Hugging Face's LlamaForCausalLM layout. Our model rotates with
// the rotate-half pairing HF uses, so weights convert by name alone (no q/k row permutation).
#pragma once

#include <optional>
#include <string>

namespace titan::models::llama3 {

// "layers.3.attention.wq.weight" -> "model.layers.3.self_attn.q_proj.weight"; nullopt if the
// name is not a Llama-3 parameter.
std::optional<std::string> to_hf_name(const std::string& ours);
// The inverse.
std::optional<std::string> from_hf_name(const std::string& hf);

}  // namespace titan::models::llama3
