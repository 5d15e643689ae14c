#include "titan/optim/optimizer.h"

namespace titan::optim {

std::string state_key_param(const std::string& key) {
  for (const char* suffix : {".exp_avg_sq", ".exp_avg", ".momentum_buffer"})
    if (key.ends_with(suffix)) return key.substr(0, key.size() - std::string(suffix).size());
  return {};
}

SavedState joined(SavedState a, SavedState b) {
  SavedState out;
  out.in_memory = std::move(a.in_memory);
  for (auto& entry : b.in_memory) out.in_memory.push_back(std::move(entry));
  const size_t first_of_b = a.streamed.size();
  out.streamed = std::move(a.streamed);
  for (auto& entry : b.streamed) out.streamed.push_back(std::move(entry));
  if (a.stream || b.stream)
    out.stream = [sa = std::move(a.stream), sb = std::move(b.stream), first_of_b](const SavedState::Emit& emit) {
      if (sa) sa(emit);
      if (sb) sb([&](size_t key, int64_t begin, const float* v, int64_t n) { emit(first_of_b + key, begin, v, n); });
    };
  return out;
}

}  // namespace titan::optim
