// PyTorch's names of the element types (torch.float32 is "float32"): how TorchTitan's configs and
// Hugging Face's torch_dtype spell them, and so how our config keys do (core/enum_names.h reads
// this table). dtype_name() keeps the short names ("f32") logs and safetensors use.
#pragma once

#include <array>
#include <span>

#include "titan/core/dtype.h"
#include "titan/core/enum_names.h"

namespace titan {

inline constexpr std::array<EnumName<DType>, kNumDTypes> kDTypeTorchNames = {{
    {DType::f32, "float32"},
    {DType::bf16, "bfloat16"},
    {DType::f16, "float16"},
    {DType::f8e4m3, "float8_e4m3fn"},
    {DType::f8e5m2, "float8_e5m2"},
    {DType::f4e2m1, "float4_e2m1fn_x2"},
    {DType::e8m0, "float8_e8m0fnu"},
    {DType::i32, "int32"},
    {DType::i64, "int64"},
    {DType::u8, "uint8"},
}};
constexpr std::span<const EnumName<DType>> enum_names(DType) { return kDTypeTorchNames; }

}  // namespace titan
