#include "titan/core/shape.h"

#include <vector>

#include "titan/core/error.h"

namespace titan {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  TITAN_CHECK(dims.size() <= size_t(kMaxDims), "a tensor has at most " + std::to_string(kMaxDims) + " dims");
  for (int64_t v : dims) d_[n_++] = v;
}

void Shape::push_back(int64_t v) {
  TITAN_CHECK(n_ < kMaxDims, "a tensor has at most " + std::to_string(kMaxDims) + " dims");
  d_[n_++] = v;
}

void Shape::erase(int i) {
  for (int j = i; j + 1 < n_; ++j) d_[j] = d_[j + 1];
  --n_;
}

void Shape::insert(int i, int64_t v) {
  TITAN_CHECK(n_ < kMaxDims, "a tensor has at most " + std::to_string(kMaxDims) + " dims");
  for (int j = n_; j > i; --j) d_[j] = d_[j - 1];
  d_[i] = v;
  ++n_;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < n_; ++i) n *= d_[i];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) s += (i ? ", " : "") + std::to_string(d_[i]);
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.n_ != b.n_) return false;
  for (int i = 0; i < a.n_; ++i)
    if (a.d_[i] != b.d_[i]) return false;
  return true;
}

GlobalSlice nested_slice(const GlobalSlice& outer, const Shape& local_shape, const Shape& offsets) {
  if (outer.global_shape.empty()) return {local_shape, offsets};
  std::vector<int64_t> o(offsets.begin(), offsets.end());
  for (size_t d = 0; d < o.size(); ++d) o[d] += outer.offsets[d];
  return {outer.global_shape, Shape(o)};
}

GlobalSlice split_slice(const GlobalSlice& slice, const Shape& local, int dim, int64_t parts, int64_t index) {
  std::vector<int64_t> global(local.begin(), local.end()), offsets(local.size(), 0);
  if (!slice.global_shape.empty()) {
    global.assign(slice.global_shape.begin(), slice.global_shape.end());
    offsets.assign(slice.offsets.begin(), slice.offsets.end());
  }
  global[size_t(dim)] = local[dim] * parts;
  offsets[size_t(dim)] = local[dim] * index;
  return {Shape(global), Shape(offsets)};
}

}  // namespace titan
