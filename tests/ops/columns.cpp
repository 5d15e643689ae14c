// Rows of the op table for kernels/columns. The kernels have no fast/reference split (a row is a
// memcpy or an add loop), so the "ref" side is the same operation written with Tensor views and
// double arithmetic. dims = {R, repeat, width}: R source rows for copy_columns (R * repeat
// destination rows), and the reverse for add_columns; column blocks start at odd offsets.
#include "common/op_table.h"
#include "titan/kernels/columns.h"

using namespace titan;
using namespace titan::test;

namespace {

constexpr int64_t kSrcCol = 3, kDstCol = 2, kSrcPad = 5, kDstPad = 4;

OpOutputs copy_case(const OpInput& in) {
  const int64_t r = in.dims[0], repeat = in.dims[1], width = in.dims[2];
  const Tensor src = random_tensor({r, width + kSrcPad}, in.dtype, in.seed, "src");
  Tensor fast = random_tensor({r * repeat, width + kDstPad}, in.dtype, in.seed, "dst");
  Tensor ref = fast.clone();
  kernels::copy_columns(fast, kDstCol, src, kSrcCol, width, repeat);
  for (int64_t row = 0; row < r * repeat; ++row) {
    Tensor block = ref.select(0, row).slice(0, kDstCol, kDstCol + width);
    block.copy_(src.select(0, row / repeat).slice(0, kSrcCol, kSrcCol + width));
  }
  return {{"dst", fast, ref, 0.0, 0.0}};
}

OpOutputs add_case(const OpInput& in) {
  const int64_t r = in.dims[0], repeat = in.dims[1], width = in.dims[2];
  const Tensor src = random_tensor({r * repeat, width + kSrcPad}, in.dtype, in.seed, "src");
  Tensor fast = random_tensor({r, width + kDstPad}, in.dtype, in.seed, "dst");
  const Tensor before = fast.clone();
  kernels::add_columns(fast, kDstCol, src, kSrcCol, width, repeat);
  Tensor ref = Tensor::empty(fast.shape(), DType::f32);
  for (int64_t row = 0; row < r; ++row)
    for (int64_t c = 0; c < width + kDstPad; ++c) {
      double v = before.at({row, c});
      if (c >= kDstCol && c < kDstCol + width)
        for (int64_t i = 0; i < repeat; ++i) v += src.at({row * repeat + i, c - kDstCol + kSrcCol});
      ref.data<float>()[row * (width + kDstPad) + c] = float(v);
    }
  return {{"dst", fast, in.dtype == DType::f32 ? ref : ref.to(in.dtype)}};
}

const std::vector<std::string> kDims = {"R", "repeat", "width"};

}  // namespace

TITAN_OP_CASES(columns) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1, 1}, {7, 1, 13}, {5, 3, 64}, {300, 16, 33}, {1029, 1, 128}};
  return {{"copy_columns", kDims, shapes, copy_case}, {"add_columns", kDims, shapes, add_case}};
}
