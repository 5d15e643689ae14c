#include "titan/kernels/quantize.h"

#include <algorithm>
#include <string>

#include "titan/core/error.h"
#include "titan/kernels/cpu/quantize.h"
#include "titan/kernels/dispatch.h"

namespace titan::kernels {

namespace {

using ref::QuantFormat;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The element format of an MX codes tensor, checked against x [R, C] and scales.
QuantFormat mx_format(const Tensor& codes, const Tensor& scales, const Tensor& x, const char* op) {
  const std::string where = std::string(op) + ": ";
  TITAN_CHECK(x.dim() == 2 && x.dtype() == DType::f32 && x.is_contiguous(),
              where + "values must be contiguous f32 [R, C], got " + x.str());
  TITAN_CHECK(codes.dtype() == DType::f8e4m3 || codes.dtype() == DType::f4e2m1,
              where + "codes must be f8e4m3 (MXFP8) or f4e2m1 (MXFP4), got " + codes.str());
  const int64_t rows = x.size(0), cols = x.size(1);
  TITAN_CHECK(codes.shape() == x.shape() && codes.is_contiguous(),
              where + "codes " + codes.str() + " must be contiguous and shaped as the values " + x.shape().str());
  TITAN_CHECK(codes.dtype() == DType::f8e4m3 || cols % 2 == 0,
              where + "MXFP4 packs two codes per byte: a row needs an even length, got " + std::to_string(cols));
  const Shape want{rows, ceil_div(cols, ref::kMxBlock)};
  TITAN_CHECK(scales.dtype() == DType::e8m0 && scales.shape() == want && scales.is_contiguous(),
              where + "scales must be contiguous e8m0 " + want.str() + ", got " + scales.str());
  return codes.dtype() == DType::f8e4m3 ? QuantFormat::e4m3 : QuantFormat::e2m1;
}

void check_fp8_blocks(const Tensor& codes, const Tensor& scales, const Tensor& x, int64_t br, int64_t bc, const char* op) {
  const std::string where = std::string(op) + ": ";
  TITAN_CHECK(br >= 1 && bc >= 1, where + "blocks of " + std::to_string(br) + " x " + std::to_string(bc),
              "use positive block sizes (DeepSeek-V3: 1 x 128 activations, 128 x 128 weights)");
  TITAN_CHECK(x.dim() == 2 && x.dtype() == DType::f32 && x.is_contiguous(),
              where + "values must be contiguous f32 [R, C], got " + x.str());
  TITAN_CHECK(codes.dtype() == DType::f8e4m3 && codes.shape() == x.shape() && codes.is_contiguous(),
              where + "codes must be contiguous f8e4m3 " + x.shape().str() + ", got " + codes.str());
  const Shape want{ceil_div(x.size(0), br), ceil_div(x.size(1), bc)};
  TITAN_CHECK(scales.dtype() == DType::f32 && scales.shape() == want && scales.is_contiguous(),
              where + "scales must be contiguous f32 " + want.str() + ", got " + scales.str());
}

void check_out(const Tensor& out, const Tensor& x, const char* op) {
  TITAN_CHECK(x.dim() == 2 && x.dtype() == DType::f32 && x.is_contiguous(),
              std::string(op) + ": values must be contiguous f32 [R, C], got " + x.str());
  TITAN_CHECK(out.dtype() == DType::f32 && out.shape() == x.shape() && out.is_contiguous(),
              std::string(op) + ": the output must be contiguous f32 " + x.shape().str() + ", got " + out.str());
}

uint8_t* bytes(Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }

}  // namespace

void mx_quantize(Tensor& codes, Tensor& scales, const Tensor& x) {
  const QuantFormat f = mx_format(codes, scales, x, "mx_quantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(mx_quantize) : &ref::mx_quantize)(bytes(codes), bytes(scales), x.data<float>(), x.size(0),
                                                             x.size(1), f);
}

void mx_dequantize(Tensor& x, const Tensor& codes, const Tensor& scales) {
  const QuantFormat f = mx_format(codes, scales, x, "mx_dequantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(mx_dequantize) : &ref::mx_dequantize)(x.data<float>(), bytes(codes), bytes(scales),
                                                                 x.size(0), x.size(1), f);
}

void fp8_block_quantize(Tensor& codes, Tensor& scales, const Tensor& x, int64_t br, int64_t bc, ScaleRule rule) {
  check_fp8_blocks(codes, scales, x, br, bc, "fp8_block_quantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(fp8_block_quantize) : &ref::fp8_block_quantize)(
      bytes(codes), scales.data<float>(), x.data<float>(), x.size(0), x.size(1), br, bc, rule);
}

void fp8_block_dequantize(Tensor& x, const Tensor& codes, const Tensor& scales, int64_t br, int64_t bc) {
  check_fp8_blocks(codes, scales, x, br, bc, "fp8_block_dequantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(fp8_block_dequantize) : &ref::fp8_block_dequantize)(
      x.data<float>(), bytes(codes), scales.data<float>(), x.size(0), x.size(1), br, bc);
}

namespace {

// The piece's rows that are the matrix's (not padding), checked with the tiles' grid.
int64_t piece_rows(const Tensor& piece, const Tensor& grid, int64_t row0, int64_t total_rows, int64_t br, int64_t bc,
                   const char* op) {
  const std::string where = std::string(op) + ": ";
  TITAN_CHECK(br >= 1 && bc >= 1 && row0 >= 0 && total_rows >= 0,
              where + "blocks of " + std::to_string(br) + " x " + std::to_string(bc) + ", piece at row " +
                  std::to_string(row0) + " of " + std::to_string(total_rows));
  TITAN_CHECK(piece.dim() == 2 && piece.dtype() == DType::f32 && piece.is_contiguous(),
              where + "the piece must be contiguous f32 [rows, C], got " + piece.str());
  const Shape want{ceil_div(total_rows, br), ceil_div(piece.size(1), bc)};
  TITAN_CHECK(grid.dtype() == DType::f32 && grid.shape() == want && grid.is_contiguous(),
              where + "the tiles' grid must be contiguous f32 " + want.str() + ", got " + grid.str());
  return std::clamp<int64_t>(total_rows - row0, 0, piece.size(0));
}

}  // namespace

void fp8_block_piece_amax(Tensor& amax, const Tensor& piece, int64_t row0, int64_t total_rows, int64_t br, int64_t bc) {
  const int64_t rows = piece_rows(piece, amax, row0, total_rows, br, bc, "fp8_block_piece_amax");
  ref::fp8_block_piece_amax(amax.data<float>(), piece.data<float>(), rows, row0, total_rows, piece.size(1), br, bc);
}

void fp8_block_scales(Tensor& scales, const Tensor& piece_amax, ScaleRule rule) {
  TITAN_CHECK(scales.dtype() == DType::f32 && scales.is_contiguous() && piece_amax.dtype() == DType::f32 &&
                  piece_amax.is_contiguous() && piece_amax.numel() % std::max<int64_t>(scales.numel(), 1) == 0,
              "fp8_block_scales: scales " + scales.str() + " from pieces' amax " + piece_amax.str(),
              "pass contiguous f32 grids, the pieces' one after another");
  const int64_t tiles = scales.numel();
  ref::fp8_block_scales(scales.data<float>(), piece_amax.data<float>(), tiles ? piece_amax.numel() / tiles : 0, tiles,
                        rule);
}

void fp8_block_piece_encode(Tensor& codes, const Tensor& piece, const Tensor& scales, int64_t row0, int64_t total_rows,
                            int64_t br, int64_t bc) {
  const int64_t rows = piece_rows(piece, scales, row0, total_rows, br, bc, "fp8_block_piece_encode");
  TITAN_CHECK(codes.dtype() == DType::f8e4m3 && codes.shape() == piece.shape() && codes.is_contiguous(),
              "fp8_block_piece_encode: codes must be contiguous f8e4m3 " + piece.shape().str() + ", got " + codes.str());
  ref::fp8_block_piece_encode(bytes(codes), piece.data<float>(), scales.data<float>(), rows, row0, piece.size(1), br,
                              bc);
  std::fill(bytes(codes) + rows * piece.size(1), bytes(codes) + codes.numel(), uint8_t(0));  // padding
}

void mx_fake_quantize(Tensor& out, const Tensor& x, DType element, bool along_rows) {
  check_out(out, x, "mx_fake_quantize");
  TITAN_CHECK(element == DType::f8e4m3 || element == DType::f4e2m1,
              std::string("mx_fake_quantize: the element format must be f8e4m3 (MXFP8) or f4e2m1 (MXFP4), got ") +
                  std::string(dtype_name(element)));
  const QuantFormat f = element == DType::f8e4m3 ? QuantFormat::e4m3 : QuantFormat::e2m1;
  const int64_t run = along_rows ? x.size(1) : x.size(0);  // the length the blocks run along
  TITAN_CHECK(f == QuantFormat::e4m3 || run % 2 == 0,
              "mx_fake_quantize: MXFP4 packs two codes per byte: blocks need an even run, got " + std::to_string(run));
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(mx_fake_quantize) : &ref::mx_fake_quantize)(
      out.data<float>(), nullptr, nullptr, x.data<float>(), x.size(0), x.size(1), f, along_rows);
}

void mx_fake_quantize(Tensor& out, Tensor& codes, Tensor& scales, const Tensor& x) {
  check_out(out, x, "mx_fake_quantize");
  const QuantFormat f = mx_format(codes, scales, x, "mx_fake_quantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(mx_fake_quantize) : &ref::mx_fake_quantize)(out.data<float>(), bytes(codes), bytes(scales),
                                                                      x.data<float>(), x.size(0), x.size(1), f, true);
}

void fp8_block_fake_quantize(Tensor& out, const Tensor& x, int64_t br, int64_t bc, ScaleRule rule) {
  check_out(out, x, "fp8_block_fake_quantize");
  TITAN_CHECK(br >= 1 && bc >= 1, "fp8_block_fake_quantize: blocks of " + std::to_string(br) + " x " + std::to_string(bc),
              "use positive block sizes (DeepSeek-V3: 1 x 128 activations, 128 x 128 weights)");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(fp8_block_fake_quantize) : &ref::fp8_block_fake_quantize)(
      out.data<float>(), nullptr, nullptr, x.data<float>(), x.size(0), x.size(1), br, bc, rule);
}

void fp8_block_fake_quantize(Tensor& out, Tensor& codes, Tensor& scales, const Tensor& x, int64_t br, int64_t bc,
                             ScaleRule rule) {
  check_out(out, x, "fp8_block_fake_quantize");
  check_fp8_blocks(codes, scales, x, br, bc, "fp8_block_fake_quantize");
  const bool fast = kernel_backend() == KernelBackend::fast;
  (fast ? TITAN_CPU_KERNEL(fp8_block_fake_quantize) : &ref::fp8_block_fake_quantize)(
      out.data<float>(), bytes(codes), scales.data<float>(), x.data<float>(), x.size(0), x.size(1), br, bc, rule);
}

}  // namespace titan::kernels
