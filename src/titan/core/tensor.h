// Tensor: a strided view over shared storage. Copying a Tensor shares its storage (as in PyTorch);
// clone() copies the data.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/shape.h"

namespace titan {

// A block of memory, owned (from the allocator) or borrowed (e.g. a memory-mapped file, freed
// by the deleter given to Tensor::from_blob).
class Storage {
 public:
  Storage(size_t bytes, MemCategory category);
  Storage(void* data, size_t bytes, std::function<void(void*)> deleter);
  // Owned storage that holds no memory yet (as after release()): reallocate() takes it.
  struct Deferred {};
  Storage(size_t bytes, MemCategory category, Deferred);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  // Owned storage only: release() returns the memory (data() becomes null, every view of it
  // unusable) and reallocate() takes the same number of bytes again, contents undefined, for all
  // views at once. FSDP frees an unsharded parameter this way while autograd still holds views
  // of it, and gathers into it again before backward (PyTorch's storage resize to 0 and back).
  void release();
  void reallocate();

 private:
  void* data_;
  size_t bytes_;
  MemCategory category_;
  std::function<void(void*)> deleter_;  // set for borrowed memory
};

class Tensor {
 public:
  Tensor() = default;  // undefined; defined() is false

  static Tensor empty(const Shape& shape, DType dtype, MemCategory category = MemCategory::temporaries);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category = MemCategory::temporaries);
  static Tensor full(const Shape& shape, double value, DType dtype,
                     MemCategory category = MemCategory::temporaries);
  // Shape and dtype with no memory yet (storage_allocated() is false; reallocate_storage() takes
  // it): a model built for the memory planner holds its parameters so (nn::ParametersWithoutStorage).
  static Tensor unallocated(const Shape& shape, DType dtype, MemCategory category);
  // Wraps memory the tensor does not own; `deleter` (may be empty) runs when the last view dies.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  MemCategory category() const { return storage_->category(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return shape_.size(); }
  int64_t size(int d) const { return shape_[wrap_dim(d)]; }
  int64_t stride(int d) const { return strides_[wrap_dim(d)]; }
  int64_t numel() const { return shape_.numel(); }
  int64_t offset() const { return offset_; }
  size_t nbytes() const { return size_t(numel() * dtype_bits(dtype_) / 8); }
  bool is_contiguous() const;
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  // The storage's memory (see Storage::release): whether it is there, and freeing / taking it again.
  bool storage_allocated() const { return storage_ && storage_->data() != nullptr; }
  void release_storage() const { storage_->release(); }
  void reallocate_storage() const { storage_->reallocate(); }

  void* data_ptr() const;
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>::value);
    return static_cast<T*>(data_ptr());
  }

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // a view when contiguous, else a contiguous copy
  Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end) along dim
  Tensor select(int dim, int64_t index) const;  // drops dim
  Tensor narrow(int dim, int64_t start, int64_t length) const { return slice(dim, start, start + length); }
  Tensor transpose(int d0, int d1) const;
  Tensor permute(std::initializer_list<int> order) const;
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;

  // ---- copies ----
  Tensor contiguous() const;  // this, when already contiguous
  Tensor clone(MemCategory category = MemCategory::temporaries) const;
  Tensor to(DType dtype, MemCategory category = MemCategory::temporaries) const;  // always a copy
  void copy_(const Tensor& src);  // same shape; any strides; converts dtype
  void fill_(double value);
  void zero_();

  double item() const;           // the value of a one-element tensor
  double at(std::initializer_list<int64_t> index) const;  // slow element read, for tests
  std::string str() const;       // "Tensor(f32, [2, 3], contiguous)"

  int wrap_dim(int d) const;

 private:
  void check_dtype(DType expected) const;
  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::f32;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace titan
