#include "titan/train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "titan/core/error.h"

namespace titan::train {

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, Generator& rng) {
  const int64_t v = int64_t(logits.size());
  TITAN_CHECK(v > 0, "sample_token: empty logits");
  if (o.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates sorted by logit (ties: lower id first), cut to top-k.
  std::vector<int32_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(size_t(k));
  std::vector<double> p(ids.size());
  const double mx = logits[size_t(ids[0])];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[size_t(ids[i])] - mx) / o.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  size_t keep = ids.size();
  if (o.top_p < 1) {
    double acc = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = double(rng.next_uniform()) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace titan::train
