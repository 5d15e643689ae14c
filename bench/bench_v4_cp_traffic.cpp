// DeepSeek-V4's context-parallel bytes per layer against DeepSeek-V3.2's DSA CP at the same
// sequence (issue 37 item 5): what one rank receives in a layer's forward (the backward sends the
// same bytes of gradients back), for V4-Flash and V4-Pro by layer type (models/deepseek_v4/plan.h,
// the busiest rank: the window's W - 1 key rows and CSA's overlap rows before each chunk from the
// neighbouring ranks, every rank's compressed entries and CSA's indexer keys) and V3.2 671B (the
// latent rows [c | k_rope] and indexer keys of every token: models/deepseek_v3/plan.cpp), one
// sequence, f32 elements for both (the ratio does not depend on the element size). The same
// figures `titan plan` adds up per block; tests/distributed/context_parallel_test.cpp checks
// plan.h against the bytes the collectives count.
//   build/bench/bench_v4_cp_traffic [--seq 32768] [--cps 2,4,8,16]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/models/deepseek_v4/plan.h"
#include "titan/models/family.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;

namespace {

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// V3.2 671B: the family's per-token all-gather bytes (f32) over a rank's share, per layer.
double v32_layer_bytes(int64_t seq, int64_t cp) {
  models::PlanQuery q;
  q.flavor = "671B", q.seq_len = seq, q.cp = int(cp);
  double per_token = 0;
  for (const auto& t : models::model_family("deepseek_v32").context_parallel_traffic(q))
    if (t.op == "all_gather") per_token += t.bytes_per_token;
  return per_token * double(cp - 1) * double(seq) / double(cp);
}

void report(const std::string& flavor, int64_t seq, int64_t cp) {
  const v4::DeepSeekV4Args a = v4::deepseek_v4_flavor(flavor, 0);
  const double v32 = v32_layer_bytes(seq, cp);
  double sum = 0;
  for (const v4::LayerType t : {v4::LayerType::sliding, v4::LayerType::csa, v4::LayerType::hca}) {
    const v4::CpLayerTraffic x = v4::context_parallel_layer_traffic(a, t, 1, seq, cp, 4);
    std::printf("  %-6s cp %-3lld %-8s before %8.2f  entries %8.2f  indexer %8.2f  total %8.2f MiB  = %.4f x V3.2\n",
                flavor.c_str(), (long long)cp,
                t == v4::LayerType::sliding ? "sliding" : t == v4::LayerType::csa ? "CSA" : "HCA",
                mib(x.sent_point_to_point()), mib(x.entries), mib(x.indexer),
                mib(x.total()), x.total() / v32);
  }
  for (const v4::LayerType t : a.layer_types) sum += v4::context_parallel_layer_traffic(a, t, 1, seq, cp, 4).total();
  const double mean = sum / double(a.n_layers);
  std::printf("  %-6s cp %-3lld mean over its %lld layers %8.2f MiB = %.4f x V3.2 671B's %8.2f MiB per layer\n",
              flavor.c_str(), (long long)cp, (long long)a.n_layers, mib(mean), mean / v32, mib(v32));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seq = 32768;
  std::vector<int64_t> cps = {2, 4, 8, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seq") seq = std::atoll(argv[i + 1]);
    if (flag == "--cps") {
      cps.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) cps.push_back(std::atoll(item.c_str()));
    }
  }
  std::printf("Context-parallel bytes one rank receives per layer, forward (backward: the same again), seq %lld, f32\n",
              (long long)seq);
  for (const int64_t cp : cps)
    for (const std::string flavor : {"flash", "pro"}) report(flavor, seq, cp);
  return 0;
}
