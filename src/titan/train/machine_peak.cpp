#include "titan/train/machine_peak.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "titan/core/cpu_features.h"

namespace titan::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path cache_file() {
  if (const char* dir = std::getenv("TITAN_CACHE_DIR"); dir && *dir) return fs::path(dir) / "machine_peak.json";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "titan" / "machine_peak.json";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "titan" / "machine_peak.json";
  return {};
}

// "vendor family/model/stepping name | isa | N threads": another CPU, kernel level or thread count
// is another entry.
std::string machine_key() {
  std::map<std::string, std::string> cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line) && !line.empty();) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    key.erase(key.find_last_not_of(" \t") + 1);
    cpu[key] = value;
  }
  return cpu["vendor_id"] + " " + cpu["cpu family"] + "/" + cpu["model"] + "/" + cpu["stepping"] + " " +
         cpu["model name"] + " | " + std::string(cpu_capability_name(cpu_capability())) + " | " +
         std::to_string(omp_get_max_threads()) + " threads";
}

json read_cache(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return json::object();
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

double field(const json& entry, const char* key) {
  const auto it = entry.find(key);
  return it != entry.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

StablePeak stable_machine_peak(double seconds) {
  StablePeak out;
  out.measured = kernels::measure_machine_peak(seconds);
  out.peak = out.measured;
  const fs::path file = cache_file();
  if (file.empty()) return out;
  const std::string key = machine_key();
  json cache = read_cache(file);
  const json entry = cache.contains(key) && cache[key].is_object() ? cache[key] : json::object();
  out.peak.f32_flops = std::max(out.peak.f32_flops, field(entry, "f32_flops"));
  out.peak.bf16_flops = std::max(out.peak.bf16_flops, field(entry, "bf16_flops"));
  out.peak.memcpy_bytes = std::max(out.peak.memcpy_bytes, field(entry, "memcpy_bytes"));
  cache[key] = {{"f32_flops", out.peak.f32_flops}, {"bf16_flops", out.peak.bf16_flops},
                {"memcpy_bytes", out.peak.memcpy_bytes}};
  // Written whole under a name of this process's, then renamed: ranks of one host may write at once.
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const fs::path tmp = file.string() + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream f(tmp);
    f << cache.dump(1) << "\n";
    f.close();
    if (f.fail()) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
  else out.cache = file;
  return out;
}

std::string StablePeak::describe(bool bf16) const {
  const double best = bf16 ? peak.bf16_flops : peak.f32_flops, now = bf16 ? measured.bf16_flops : measured.f32_flops;
  char buf[256];
  std::snprintf(buf, sizeof buf, "MFU against a %s peak of %.1f GFLOP/s on %d threads: the best measured on this machine "
                "(this run %.1f)%s", bf16 ? "bf16" : "f32", best / 1e9, omp_get_max_threads(), now / 1e9,
                cache.empty() ? "" : (", kept in " + cache.string()).c_str());
  return buf;
}

}  // namespace titan::train
