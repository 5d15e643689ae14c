// A tensor shape (or strides): up to kMaxDims int64 values stored inline, so shapes never allocate;
// and the global slice a sharded tensor covers.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace titan {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t back() const { return d_[n_ - 1]; }
  void push_back(int64_t v);
  void erase(int i);
  void insert(int i, int64_t v);
  int64_t numel() const;  // product of the dims (1 for a scalar shape)
  std::string str() const;  // "[2, 3, 4]"
  friend bool operator==(const Shape& a, const Shape& b);

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

// Where a (possibly sharded) tensor sits in its full, global tensor: element [i0, i1, ...] of
// the local tensor is element [i0 + offsets[0], ...] of a tensor with `global_shape`.
struct GlobalSlice {
  Shape global_shape;
  Shape offsets;
};

// The slice of the global tensor that a part of a local tensor covers: the part starts at
// `offsets` in a local tensor of `local_shape`, which sits at `outer` (empty: the local tensor is
// the global one). E.g. an FSDP shard (rows of the local tensor) of a tensor-parallel shard.
GlobalSlice nested_slice(const GlobalSlice& outer, const Shape& local_shape, const Shape& offsets);

// A local tensor of `local` shape that sits at `slice` (empty: it was the whole tensor), when its
// dimension `dim` is piece `index` of `parts` equal pieces of the global one: the slice it then
// covers. E.g. a rank's routed experts (dim 0 over EP) that also hold 1/tp of each expert's
// hidden units (dim 1 over TP).
GlobalSlice split_slice(const GlobalSlice& slice, const Shape& local, int dim, int64_t parts, int64_t index);

}  // namespace titan
