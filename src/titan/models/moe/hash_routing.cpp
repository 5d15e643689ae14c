#include "titan/models/moe/hash_routing.h"

#include <string>

#include "titan/core/error.h"

namespace titan::models::moe {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

Tensor hash_choice(const Tensor& tid2eid, const Tensor& token_ids, int64_t tokens, int64_t experts) {
  TITAN_CHECK(token_ids.defined(), "moe: a hash_moe layer got no token ids (its experts are tid2eid[token id])",
              "pass the layer's input ids (i32, one per token) to forward_with_aux; the inputs_embeds path cannot "
              "route a hash layer");
  TITAN_CHECK(token_ids.dtype() == DType::i32 && token_ids.numel() == tokens && token_ids.is_contiguous(),
              "moe: token ids " + token_ids.str() + " for " + str(tokens) + " tokens",
              "pass one contiguous i32 id per token of x");
  const int64_t vocab = tid2eid.size(0), k = tid2eid.size(1);
  Tensor idx = Tensor::empty({tokens, k}, DType::i32, MemCategory::activations);  // [T, K]
  const int32_t* ids = token_ids.data<int32_t>();
  const int64_t* table = tid2eid.data<int64_t>();
  int32_t* out = idx.data<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TITAN_CHECK(ids[t] >= 0 && ids[t] < vocab,
                "moe: token id " + str(ids[t]) + " at " + str(t) + " outside tid2eid's " + str(vocab) + " rows",
                "ids must be below vocab_size");
    for (int64_t j = 0; j < k; ++j) {
      const int64_t expert = table[ids[t] * k + j];
      TITAN_CHECK(expert >= 0 && expert < experts,
                  "moe: tid2eid[" + str(ids[t]) + ", " + str(j) + "] = " + str(expert) + " of " + str(experts) +
                      " experts",
                  "load a tid2eid whose entries are expert ids in [0, n_routed_experts)");
      out[t * k + j] = int32_t(expert);
    }
  }
  return idx;
}

}  // namespace titan::models::moe
