#include "titan/models/common.h"

#include <algorithm>

namespace titan::models {

void check_rope_positions(const std::string& model, const Tensor& positions, int64_t table_rows) {
  TITAN_CHECK(positions.dtype() == DType::i32 && positions.is_contiguous(), model + ": positions must be contiguous i32");
  const int32_t* pos = positions.data<int32_t>();
  const int32_t max_pos = positions.numel() ? *std::max_element(pos, pos + positions.numel()) : 0;
  TITAN_CHECK(max_pos < table_rows, model + ": position " + std::to_string(max_pos) + " is past the RoPE table (" +
                                        std::to_string(table_rows) + ")",
              "raise the model's max_seq_len or lower training.seq_len");
}

}  // namespace titan::models
