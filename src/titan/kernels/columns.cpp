#include "titan/kernels/columns.h"

#include <string>
#include <vector>

#include "titan/core/parallel.h"
#include "titan/kernels/ref/scalar.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

struct Blocks {
  int64_t dst_rows, dst_width, src_width;
};

// Validates a column block [col, col + width) on both sides and the row ratio `repeat`
// (src_rows = dst_rows * repeat when `src_has_more_rows`, else dst_rows = src_rows * repeat).
Blocks check_blocks(const char* op, const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                    int64_t width, int64_t repeat, bool src_has_more_rows) {
  detail::check_activation(dst, op, "dst");
  detail::check_activation(src, op, "src");
  const int64_t dw = detail::last_dim(dst, op), sw = detail::last_dim(src, op);
  TITAN_CHECK(width >= 0 && dst_col >= 0 && src_col >= 0 && dst_col + width <= dw && src_col + width <= sw,
              std::string(op) + ": columns [" + std::to_string(src_col) + ", " + std::to_string(src_col + width) +
                  ") of " + src.str() + " -> [" + std::to_string(dst_col) + ", " + std::to_string(dst_col + width) +
                  ") of " + dst.str() + " fall outside the rows",
              "the column block must fit inside the last dim of both tensors");
  const int64_t dr = dst.numel() / dw, sr = src.numel() / sw;
  TITAN_CHECK(repeat >= 1 && (src_has_more_rows ? sr == dr * repeat : dr == sr * repeat),
              std::string(op) + ": " + std::to_string(sr) + " source rows and " + std::to_string(dr) +
                  " destination rows do not differ by the repeat factor " + std::to_string(repeat),
              "the tensors' leading dims must match, up to the broadcast (repeat) dim");
  return {dr, dw, sw};
}

}  // namespace

void copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t width, int64_t repeat) {
  const Blocks b = check_blocks("copy_columns", dst, dst_col, src, src_col, width, repeat, false);
  const int64_t es_d = dtype_bits(dst.dtype()) / 8, es_s = dtype_bits(src.dtype()) / 8;
  uint8_t* d = static_cast<uint8_t*>(dst.data_ptr());
  const uint8_t* s = static_cast<const uint8_t*>(src.data_ptr());
  parallel_for(0, b.dst_rows, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      convert(d + (r * b.dst_width + dst_col) * es_d, dst.dtype(), s + ((r / repeat) * b.src_width + src_col) * es_s,
              src.dtype(), width);
    }
  });
}

void add_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t width, int64_t repeat) {
  const Blocks b = check_blocks("add_columns", dst, dst_col, src, src_col, width, repeat, true);
  TITAN_CHECK(dst.dtype() == src.dtype(), "add_columns: dst is " + dst.str() + " but src is " + src.str(),
              "a gradient and its source share the activation dtype");
  detail::dispatch_activation(dst.dtype(), [&]<class T>() {
    T* d = dst.data<T>();
    const T* s = src.data<T>();
    parallel_for(0, b.dst_rows, 64, [&](int64_t lo, int64_t hi) {
      std::vector<float> acc(static_cast<size_t>(width));
      for (int64_t r = lo; r < hi; ++r) {
        T* drow = d + r * b.dst_width + dst_col;
        // Scalar math: acc[j] = dst[j] + sum_i src[r * repeat + i][j], in f32.
        for (int64_t j = 0; j < width; ++j) acc[size_t(j)] = ref::load(drow[j]);
        for (int64_t i = 0; i < repeat; ++i) {
          const T* srow = s + (r * repeat + i) * b.src_width + src_col;
          for (int64_t j = 0; j < width; ++j) acc[size_t(j)] += ref::load(srow[j]);
        }
        for (int64_t j = 0; j < width; ++j) drow[j] = ref::store<T>(acc[size_t(j)]);
      }
    });
  });
}

}  // namespace titan::kernels
