#include "titan/models/llama3/args.h"

#include <cmath>
#include <vector>

#include "titan/core/error.h"

namespace titan::models::llama3 {

int64_t Llama3Args::ffn_hidden() const {
  int64_t hidden = 4 * dim;
  hidden = 2 * hidden / 3;
  if (ffn_dim_multiplier) hidden = int64_t(*ffn_dim_multiplier * double(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

kernels::RopeConfig Llama3Args::rope() const {
  kernels::RopeConfig c;
  c.rope_dims = head_dim();
  c.theta = rope_theta;
  if (rope_llama3_scaling) {
    c.scaling = kernels::RopeScaling::llama3;
    c.factor = 8;
    c.low_freq_factor = 1;
    c.high_freq_factor = 4;
    c.original_max_position_embeddings = 8192;
  }
  return c;
}

int64_t Llama3Args::num_parameters(bool include_embedding) const {
  const int64_t hd = head_dim(), kv = kv_heads(), f = ffn_hidden();
  const int64_t attn = dim * n_heads * hd + 2 * dim * kv * hd + n_heads * hd * dim;
  const int64_t ffn = 3 * dim * f;
  const int64_t per_layer = attn + ffn + 2 * dim;
  const int64_t embedding = vocab_size * dim;
  const int64_t output = tie_embeddings ? 0 : vocab_size * dim;
  return n_layers * per_layer + dim + output + (include_embedding ? embedding : 0);
}

double Llama3Args::training_flops_per_token(int64_t seq_len) const {
  return 6.0 * double(num_parameters(false)) + 12.0 * double(n_layers * n_heads * head_dim() * seq_len);
}

void Llama3Args::validate() const {
  TITAN_CHECK(dim > 0 && n_layers > 0 && n_heads > 0 && vocab_size > 0, "llama3: dim, n_layers, n_heads and vocab_size must be positive");
  TITAN_CHECK(dim % n_heads == 0, "llama3: dim " + std::to_string(dim) + " is not divisible by n_heads " +
                                      std::to_string(n_heads));
  TITAN_CHECK(n_heads % kv_heads() == 0, "llama3: n_heads " + std::to_string(n_heads) +
                                             " is not a multiple of n_kv_heads " + std::to_string(kv_heads()));
  TITAN_CHECK(head_dim() % 2 == 0, "llama3: head_dim must be even for RoPE");
}

namespace {
struct Flavor {
  const char* name;
  Llama3Args args;
};

std::vector<Flavor> flavors() {
  Llama3Args debug;  // TorchTitan's debugmodel: dim 256, 6 layers, 16 heads
  Llama3Args m125 = debug;
  m125.dim = 768, m125.n_layers = 12, m125.n_heads = 12;
  Llama3Args b8;
  b8.dim = 4096, b8.n_layers = 32, b8.n_heads = 32, b8.n_kv_heads = 8, b8.vocab_size = 128256;
  b8.ffn_dim_multiplier = 1.3, b8.multiple_of = 1024, b8.max_seq_len = 8192;
  Llama3Args b70 = b8;
  b70.dim = 8192, b70.n_layers = 80, b70.n_heads = 64, b70.multiple_of = 4096;
  Llama3Args b405 = b8;
  b405.dim = 16384, b405.n_layers = 126, b405.n_heads = 128, b405.ffn_dim_multiplier = 1.2, b405.multiple_of = 4096;
  return {{"debugmodel", debug}, {"125M", m125}, {"8B", b8}, {"70B", b70}, {"405B", b405}};
}
}  // namespace

Llama3Args llama3_flavor(const std::string& flavor, int64_t vocab_size) {
  for (const Flavor& f : flavors()) {
    if (f.name != flavor) continue;
    Llama3Args a = f.args;
    if (vocab_size > 0) a.vocab_size = vocab_size;
    a.validate();
    return a;
  }
  std::string names;
  for (const std::string& f : llama3_flavor_names()) names += (names.empty() ? "" : ", ") + f;
  TITAN_FAIL("unknown llama3 flavor '" + flavor + "'", "set [model] flavor to one of: " + names);
}

std::vector<std::string> llama3_flavor_names() {
  std::vector<std::string> names;
  for (const Flavor& f : flavors()) names.emplace_back(f.name);
  return names;
}

}  // namespace titan::models::llama3
