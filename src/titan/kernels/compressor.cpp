#include "titan/kernels/compressor.h"

#include "titan/core/error.h"
#include "titan/kernels/cpu/compressor.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::use_fast;

namespace {

struct Dims {
  int64_t B, S, D;
};

void check(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  TITAN_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == shape,
              std::string(op) + ": " + name + " must be f32 contiguous " + shape.str() + ", got " + t.str());
}

// B, S and D from kv [B, S, C], checking gate and the bias [m, C] against it.
Dims dims_of(const Tensor& kv, const Tensor& gate, const Tensor& bias, int64_t m, CompressorKind kind, const char* op) {
  TITAN_CHECK(kv.dim() == 3 && m >= 1, std::string(op) + ": kv must be [B, S, C] and m >= 1, got " + kv.str() +
                                           " and m = " + std::to_string(m));
  const int64_t C = kv.size(2);
  TITAN_CHECK(kind == CompressorKind::hca || C % 2 == 0,
              std::string(op) + ": CSA's kv has 2D channels (an even count), got " + kv.str());
  check(kv, kv.shape(), op, "kv");
  check(gate, kv.shape(), op, "gate");
  check(bias, Shape{m, C}, op, "bias");
  return {kv.size(0), kv.size(1), kind == CompressorKind::hca ? C : C / 2};
}

}  // namespace

void compressor_forward(Tensor& out, const Tensor& kv, const Tensor& gate, const Tensor& bias, int64_t m,
                        CompressorKind kind) {
  const Dims d = dims_of(kv, gate, bias, m, kind, "compressor_forward");
  check(out, Shape{d.B, d.S / m, d.D}, "compressor_forward", "out");
  if (out.numel() == 0) return;
  (use_fast() ? TITAN_CPU_KERNEL(compressor_forward) : &ref::compressor_forward<float>)(
      out.data<float>(), kv.data<float>(), gate.data<float>(), bias.data<float>(), d.B, d.S, d.D, m, kind);
}

void compressor_backward(Tensor& dkv, Tensor& dgate, Tensor& dbias, const Tensor& dout, const Tensor& kv,
                         const Tensor& gate, const Tensor& bias, int64_t m, CompressorKind kind) {
  const Dims d = dims_of(kv, gate, bias, m, kind, "compressor_backward");
  check(dout, Shape{d.B, d.S / m, d.D}, "compressor_backward", "dout");
  check(dkv, kv.shape(), "compressor_backward", "dkv");
  check(dgate, kv.shape(), "compressor_backward", "dgate");
  check(dbias, bias.shape(), "compressor_backward", "dbias");
  if (dout.numel() == 0) return;
  (use_fast() ? TITAN_CPU_KERNEL(compressor_backward) : &ref::compressor_backward<float>)(
      dkv.data<float>(), dgate.data<float>(), dbias.data<float>(), dout.data<float>(), kv.data<float>(),
      gate.data<float>(), bias.data<float>(), d.B, d.S, d.D, m, kind);
}

}  // namespace titan::kernels
