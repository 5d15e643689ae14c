// Temporary buffers for kernels in kernels/cpu/ (per-ISA namespace, as cpu/isa.h requires).
#pragma once

#include <cstddef>
#include <cstdint>

#include "titan/core/allocator.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// `count` elements of scratch from the caching allocator (no system call once a step is warm).
template <class E>
class Scratch {
 public:
  explicit Scratch(int64_t count)
      : bytes_(size_t(count) * sizeof(E)), data_(static_cast<E*>(memory_alloc(bytes_, MemCategory::temporaries))) {}
  ~Scratch() { memory_free(data_, bytes_, MemCategory::temporaries); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  E* data() const { return data_; }

 private:
  size_t bytes_;
  E* data_;
};

}  // namespace titan::kernels::cpu::TITAN_ISA
