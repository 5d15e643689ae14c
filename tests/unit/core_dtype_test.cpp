#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "titan/core/dtype.h"
#include "titan/core/error.h"

using namespace titan;

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.015625f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.1f / 256)), 1.0078125f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(3.4e38f))));  // rounds past the max to inf
}

TEST(DType, F16MatchesIeee) {
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);  // halfway above max: to inf
  EXPECT_EQ(f32_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f32_to_f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.98e-08f).bits, 0x0000);               // below half of it
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048).bits, 0x3c00);     // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048).bits, 0x3c02);
  for (uint32_t b = 0; b < 0x7c00; ++b) {  // every finite positive half round-trips
    const float f = f16_to_f32(f16{uint16_t(b)});
    ASSERT_EQ(f32_to_f16(f).bits, b) << b;
  }
}

TEST(DType, Fp8AndFp4) {
  EXPECT_EQ(f8e4m3_to_f32(f8e4m3{0x7e}), 448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f8e4m3{0x7f})));
  EXPECT_EQ(f32_to_f8e4m3(1000.0f).bits, 0x7e);  // saturates
  EXPECT_EQ(f8e4m3_to_f32(f8e4m3{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e5m2_to_f32(f8e5m2{0x7b}), 57344.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(f8e5m2{0x7c})));
  for (uint32_t b = 0; b < 0x7f; ++b) ASSERT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(f8e4m3{uint8_t(b)})).bits, b);
  for (uint32_t b = 0; b < 0x7c; ++b) ASSERT_EQ(f32_to_f8e5m2(f8e5m2_to_f32(f8e5m2{uint8_t(b)})).bits, b);
  const float fp4[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(f4e2m1_to_f32(uint8_t(i)), fp4[i]);
    EXPECT_EQ(f4e2m1_to_f32(uint8_t(i | 8)), -fp4[i]);
    EXPECT_EQ(f32_to_f4e2m1(fp4[i]), i);
  }
  EXPECT_EQ(f32_to_f4e2m1(2.5f), 4);   // tie between 2 (even mantissa) and 3
  EXPECT_EQ(f32_to_f4e2m1(100.f), 7);  // saturates at 6
  EXPECT_EQ(e8m0_to_f32(e8m0{127}), 1.0f);
  EXPECT_EQ(f32_to_e8m0(0.75f).bits, 126);  // floor(log2 0.75) = -1
  EXPECT_EQ(f32_to_e8m0(8.0f).bits, 130);
}

TEST(DType, BulkConvertAndNames) {
  float src[5] = {1.5f, -2.25f, 3e-3f, 7.0f, -0.0f};
  bf16 mid[5];
  float back[5];
  convert(mid, DType::bf16, src, DType::f32, 5);
  convert(back, DType::f32, mid, DType::bf16, 5);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(back[i], src[i], std::fabs(src[i]) / 128);
  int32_t ints[5];
  convert(ints, DType::i32, src, DType::f32, 5);
  EXPECT_EQ(ints[0], 2);  // 1.5 rounds to even
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(dtype_from_name("BF16"), DType::bf16);
  EXPECT_EQ(dtype_from_name("f8e4m3"), DType::f8e4m3);
  EXPECT_THROW(dtype_from_name("float128"), Error);
}
