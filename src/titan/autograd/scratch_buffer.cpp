#include "titan/autograd/scratch_buffer.h"

namespace titan::autograd {

Tensor ScratchBuffer::get(const Shape& shape, DType dtype) {
  const int64_t n = shape.numel();
  if (!flat_.defined() || flat_.dtype() != dtype || flat_.numel() < n)
    flat_ = Tensor::empty({n}, dtype, MemCategory::temporaries);
  return flat_.slice(0, 0, n).view(shape);
}

}  // namespace titan::autograd
