// Sampling the next token for text generation: temperature, top-k and top-p (nucleus),
// reproducible from a seed (the decoding loop is `titan generate`, cli/generate_cli.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "titan/core/rng.h"

namespace titan::train {

struct SamplingOptions {
  double temperature = 0.8;  // <= 0: greedy (argmax)
  int64_t top_k = 50;        // <= 0: no top-k cut
  double top_p = 0.95;       // >= 1: no nucleus cut
};

// Draws the next token from logits [V] (one uniform from `rng` per call).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, Generator& rng);

}  // namespace titan::train
