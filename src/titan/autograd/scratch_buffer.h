// A buffer kept from call to call for an op's short-lived operands (a GEMM's quantized or cast
// inputs): it grows only when a call needs more than every call before, so a steady-state step
// allocates nothing for them. Declare one `thread_local` per use; what get() returns lives until
// that buffer's next get(), so a caller uses it within one call (a forward, or one backward).
#pragma once

#include "titan/core/tensor.h"

namespace titan::autograd {

class ScratchBuffer {
 public:
  // A contiguous [shape] dtype view of the buffer (contents unspecified).
  Tensor get(const Shape& shape, DType dtype);

 private:
  Tensor flat_;  // 1-D, the largest request so far
};

}  // namespace titan::autograd
