#include "titan/models/common.h"

#include <algorithm>

namespace titan::models {

Tensor default_positions(int64_t batch, int64_t seq, int64_t start) {
  Tensor p = Tensor::empty({batch, seq}, DType::i32, MemCategory::activations);
  int32_t* d = p.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) d[b * seq + s] = int32_t(start + s);
  return p;
}

void check_rope_positions(const std::string& model, const Tensor& positions, int64_t table_rows) {
  TITAN_CHECK(positions.dtype() == DType::i32 && positions.is_contiguous(), model + ": positions must be contiguous i32");
  const int32_t* pos = positions.data<int32_t>();
  const int32_t max_pos = positions.numel() ? *std::max_element(pos, pos + positions.numel()) : 0;
  TITAN_CHECK(max_pos < table_rows, model + ": position " + std::to_string(max_pos) + " is past the RoPE table (" +
                                        std::to_string(table_rows) + ")",
              "raise the model's max_seq_len or lower training.seq_len");
}

}  // namespace titan::models
