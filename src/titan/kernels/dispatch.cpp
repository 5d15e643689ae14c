#include "titan/kernels/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "titan/core/error.h"

namespace titan::kernels {
namespace {
std::atomic<int>& backend() {
  static std::atomic<int> b = [] {
    const char* env = std::getenv("TITAN_KERNELS");
    if (!env || !*env || std::string(env) == "fast") return int(KernelBackend::fast);
    TITAN_CHECK(std::string(env) == "reference", "TITAN_KERNELS=" + std::string(env) + " is not a kernel backend",
                "use TITAN_KERNELS=fast or TITAN_KERNELS=reference");
    return int(KernelBackend::reference);
  }();
  return b;
}
}  // namespace

KernelBackend kernel_backend() { return KernelBackend(backend().load(std::memory_order_relaxed)); }
void set_kernel_backend(KernelBackend b) { backend().store(int(b)); }

}  // namespace titan::kernels
