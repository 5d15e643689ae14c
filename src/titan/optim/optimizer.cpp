#include "titan/optim/optimizer.h"

namespace titan::optim {

std::string state_key_param(const std::string& key) {
  for (const char* suffix : {".exp_avg_sq", ".exp_avg", ".momentum_buffer"})
    if (key.ends_with(suffix)) return key.substr(0, key.size() - std::string(suffix).size());
  return {};
}

}  // namespace titan::optim
