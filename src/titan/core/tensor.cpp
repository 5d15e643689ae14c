#include "titan/core/tensor.h"

#include <cstring>
#include <vector>

#include "titan/core/parallel.h"

namespace titan {

Storage::Storage(size_t bytes, MemCategory category)
    : data_(memory_alloc(bytes, category)), bytes_(bytes), category_(category) {}

Storage::Storage(size_t bytes, MemCategory category, Deferred) : data_(nullptr), bytes_(bytes), category_(category) {}

Storage::Storage(void* data, size_t bytes, std::function<void(void*)> deleter)
    : data_(data), bytes_(bytes), category_(MemCategory::temporaries), deleter_(std::move(deleter)) {
  if (!deleter_) deleter_ = [](void*) {};
}

Storage::~Storage() {
  if (deleter_) {
    deleter_(data_);
  } else if (data_) {
    memory_free(data_, bytes_, category_);
  }
}

void Storage::release() {
  TITAN_CHECK(!deleter_, "release() of borrowed memory (a mapped file or a blob)");
  if (data_) memory_free(data_, bytes_, category_);
  data_ = nullptr;
}

void Storage::reallocate() {
  TITAN_CHECK(!deleter_, "reallocate() of borrowed memory (a mapped file or a blob)");
  if (!data_) data_ = memory_alloc(bytes_, category_);
}

Shape contiguous_strides(const Shape& shape) {
  Shape s = shape;
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

namespace {
void check_shape(const Shape& shape) {
  for (int64_t d : shape)
    TITAN_CHECK(d >= 0, "negative dimension in shape " + shape.str());
}
// Every product checked: a shape from a file (a checkpoint's metadata, a safetensors header) whose
// byte count wraps around would otherwise allocate a few bytes that later writes overrun.
size_t storage_bytes(const Shape& shape, DType dtype) {
  int64_t numel = 1, bits = 0;
  for (int64_t d : shape)
    TITAN_CHECK(!__builtin_mul_overflow(numel, d, &numel), "shape " + shape.str() + " has more elements than int64 holds");
  TITAN_CHECK(!__builtin_mul_overflow(numel, int64_t(dtype_bits(dtype)), &bits) && bits <= INT64_MAX - 7,
              "a " + std::string(dtype_name(dtype)) + " tensor of shape " + shape.str() + " needs more bytes than int64 holds");
  return size_t((bits + 7) / 8);
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category) {
  check_shape(shape);
  Tensor t;
  t.storage_ = std::make_shared<Storage>(storage_bytes(shape, dtype), category);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::unallocated(const Shape& shape, DType dtype, MemCategory category) {
  check_shape(shape);
  Tensor t;
  t.storage_ = std::make_shared<Storage>(storage_bytes(shape, dtype), category, Storage::Deferred{});
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category) {
  Tensor t = empty(shape, dtype, category);
  // Gradient buffers run to tens of MB, which one thread's memset fills well below the memory
  // bandwidth; large fills are split over the threads in 1 MiB pieces.
  uint8_t* d = static_cast<uint8_t*>(t.data_ptr());
  parallel_for(0, int64_t(storage_bytes(shape, dtype)), int64_t(1) << 20,
               [d](int64_t lo, int64_t hi) { std::memset(d + lo, 0, size_t(hi - lo)); });
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, MemCategory category) {
  Tensor t = empty(shape, dtype, category);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter) {
  check_shape(shape);
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, storage_bytes(shape, dtype), std::move(deleter));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

int Tensor::wrap_dim(int d) const {
  const int n = shape_.size();
  TITAN_CHECK(d >= -n && d < n, "dim " + std::to_string(d) + " out of range for a tensor of shape " + shape_.str());
  return d < 0 ? d + n : d;
}

void Tensor::check_dtype(DType expected) const {
  TITAN_CHECK(dtype_ == expected, "tensor has dtype " + std::string(dtype_name(dtype_)) + ", accessed as " +
                                      std::string(dtype_name(expected)));
}

void* Tensor::data_ptr() const {
  TITAN_CHECK(defined(), "use of an undefined tensor");
  TITAN_CHECK(dtype_bits(dtype_) >= 8 || offset_ % 2 == 0, "an f4e2m1 view must start on a byte boundary");
  TITAN_CHECK(storage_->data() != nullptr || storage_->bytes() == 0,
              "use of a tensor whose storage is released (" + str() + ")",
              "an FSDP-sharded parameter is unsharded only inside its unit's forward and backward");
  return static_cast<uint8_t*>(storage_->data()) + offset_ * dtype_bits(dtype_) / 8;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = shape_.size() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  TITAN_CHECK(is_contiguous(), "view() of a non-contiguous tensor " + str(), "call contiguous() or reshape()");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TITAN_CHECK(infer < 0, "view shape " + shape.str() + " has more than one -1");
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TITAN_CHECK(known > 0 && numel() % known == 0, "cannot view " + shape_.str() + " as " + shape.str());
    s[infer] = numel() / known;
  }
  TITAN_CHECK(s.numel() == numel(), "cannot view " + shape_.str() + " (" + std::to_string(numel()) +
                                        " elements) as " + shape.str());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::slice(int dim, int64_t start, int64_t end) const {
  const int d = wrap_dim(dim);
  TITAN_CHECK(0 <= start && start <= end && end <= shape_[d],
              "slice [" + std::to_string(start) + ", " + std::to_string(end) + ") out of range for dim " +
                  std::to_string(d) + " of shape " + shape_.str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
  const int d = wrap_dim(dim);
  TITAN_CHECK(0 <= index && index < shape_[d],
              "index " + std::to_string(index) + " out of range for dim " + std::to_string(d) + " of shape " + shape_.str());
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  t.shape_.erase(d);
  t.strides_.erase(d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  const int a = wrap_dim(d0), b = wrap_dim(d1);
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::permute(std::initializer_list<int> order) const {
  TITAN_CHECK(int(order.size()) == dim(), "permute needs " + std::to_string(dim()) + " dims");
  Tensor t = *this;
  bool seen[kMaxDims] = {};
  int i = 0;
  for (int o : order) {
    const int d = wrap_dim(o);
    TITAN_CHECK(!seen[d], "permute order repeats dim " + std::to_string(d));
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
    ++i;
  }
  return t;
}

Tensor Tensor::unsqueeze(int dim) const {
  const int n = shape_.size();
  TITAN_CHECK(dim >= -n - 1 && dim <= n, "unsqueeze dim out of range");
  const int d = dim < 0 ? dim + n + 1 : dim;
  Tensor t = *this;
  t.shape_.insert(d, 1);
  t.strides_.insert(d, d < n ? strides_[d] * shape_[d] : 1);
  return t;
}

Tensor Tensor::squeeze(int dim) const {
  const int d = wrap_dim(dim);
  TITAN_CHECK(shape_[d] == 1, "squeeze of dim " + std::to_string(d) + " of size " + std::to_string(shape_[d]));
  Tensor t = *this;
  t.shape_.erase(d);
  t.strides_.erase(d);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone(defined() ? category() : MemCategory::temporaries);
}

Tensor Tensor::clone(MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype, MemCategory category) const {
  Tensor t = empty(shape_, dtype, category);
  t.copy_(*this);
  return t;
}

namespace {
// Calls f(dst_linear_index, src_element_offset) for every element of a strided source, in
// row-major order of its shape.
template <class F>
void for_each_strided(const Shape& shape, const Shape& strides, int64_t offset, F&& f) {
  const int n = shape.size();
  const int64_t total = shape.numel();
  if (total == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t off = offset;
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}
}  // namespace

void Tensor::copy_(const Tensor& src) {
  TITAN_CHECK(src.shape_ == shape_, "copy_ from shape " + src.shape_.str() + " into shape " + shape_.str());
  if (numel() == 0) return;
  if (is_contiguous() && src.is_contiguous()) {
    convert(data_ptr(), dtype_, src.data_ptr(), src.dtype_, numel());
    return;
  }
  // Strided: gather the source into a contiguous buffer in the destination dtype, then scatter.
  const int bits = dtype_bits(src.dtype_);
  uint8_t* sbase = static_cast<uint8_t*>(src.storage_->data());
  Tensor staged = is_contiguous() ? *this : empty(shape_, dtype_);
  void* sdst = staged.data_ptr();
  if (bits >= 8 && src.dtype_ == dtype_) {
    const size_t es = size_t(bits / 8);
    for_each_strided(src.shape_, src.strides_, src.offset_, [&](int64_t i, int64_t off) {
      std::memcpy(static_cast<uint8_t*>(sdst) + i * es, sbase + off * int64_t(es), es);
    });
  } else {
    for_each_strided(src.shape_, src.strides_, src.offset_, [&](int64_t i, int64_t off) {
      store_from_double(sdst, dtype_, i, load_as_double(sbase, src.dtype_, off));
    });
  }
  if (staged.storage_ == storage_) return;
  uint8_t* dbase = static_cast<uint8_t*>(storage_->data());
  for_each_strided(shape_, strides_, offset_, [&](int64_t i, int64_t off) {
    store_from_double(dbase, dtype_, off, load_as_double(sdst, dtype_, i));
  });
}

void Tensor::fill_(double value) {
  if (numel() == 0) return;
  Tensor one = empty({1}, dtype_);
  store_from_double(one.data_ptr(), dtype_, 0, value);
  if (is_contiguous() && dtype_bits(dtype_) >= 8) {
    const size_t es = size_t(dtype_bits(dtype_) / 8);
    uint8_t* d = static_cast<uint8_t*>(data_ptr());
    const int64_t n = numel();
    if (dtype_ == DType::f32) {
      const float v = float(value);
      float* f = reinterpret_cast<float*>(d);
      // Split over the threads like zeros(): zero_grad fills every parameter's gradient.
      parallel_for(0, n, int64_t(1) << 18, [f, v](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) f[i] = v;
      });
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * int64_t(es), one.data_ptr(), es);
    }
    return;
  }
  uint8_t* base = static_cast<uint8_t*>(storage_->data());
  for_each_strided(shape_, strides_, offset_, [&](int64_t, int64_t off) { store_from_double(base, dtype_, off, value); });
}

void Tensor::zero_() { fill_(0.0); }

double Tensor::item() const {
  TITAN_CHECK(numel() == 1, "item() of a tensor with " + std::to_string(numel()) + " elements");
  return load_as_double(storage_->data(), dtype_, offset_);
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  TITAN_CHECK(int(index.size()) == dim(), "at() needs " + std::to_string(dim()) + " indices");
  int64_t off = offset_;
  int i = 0;
  for (int64_t v : index) {
    TITAN_CHECK(v >= 0 && v < shape_[i], "index out of range in at()");
    off += v * strides_[i++];
  }
  return load_as_double(storage_->data(), dtype_, off);
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(" + std::string(dtype_name(dtype_)) + ", " + shape_.str() +
         (is_contiguous() ? ", contiguous)" : ", strided)");
}

}  // namespace titan
