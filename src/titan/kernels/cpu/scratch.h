// Temporary buffers for kernels in kernels/cpu/ (per-ISA namespace, as cpu/isa.h requires).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "titan/core/allocator.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

enum class ScratchInit { uninitialized, zeroed };

// `count` elements of scratch from the caching allocator (no system call once a step is warm),
// zero-filled on request.
template <class E>
class Scratch {
 public:
  explicit Scratch(int64_t count, ScratchInit init = ScratchInit::uninitialized)
      : bytes_(size_t(count) * sizeof(E)), data_(static_cast<E*>(memory_alloc(bytes_, MemCategory::temporaries))) {
    if (init == ScratchInit::zeroed) std::memset(static_cast<void*>(data_), 0, bytes_);
  }
  ~Scratch() { memory_free(data_, bytes_, MemCategory::temporaries); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  E* data() const { return data_; }

 private:
  size_t bytes_;
  E* data_;
};

}  // namespace titan::kernels::cpu::TITAN_ISA
