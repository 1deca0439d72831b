// consolidate --dtype's element conversion, bit for bit against what torch's vectorized CPU
// conversion gave for contiguous tensors (tensor.to(torch.bfloat16) / .to(torch.float16), torch
// 2.15 on x86; torch 1.13 agrees but for float16 NaN payloads, which it drops).
#include "shardckpt/engine/model/float_convert.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace shardckpt {
namespace {

struct Case {
  uint32_t f32;
  uint16_t bf16;
  uint16_t f16;
};

TEST(FloatConvert, Float32ToHalvesAsTorchDoes) {
  const Case cases[] = {
      {0x00000000u, 0x0000, 0x0000},  // +0
      {0x80000000u, 0x8000, 0x8000},  // -0
      {0x3F800000u, 0x3F80, 0x3C00},  // 1
      {0x3F808000u, 0x3F80, 0x3C04},  // 1 + 2^-8: a tie in bf16, kept even
      {0x3F818000u, 0x3F82, 0x3C0C},  // 1 + 3*2^-8: a tie, rounded up to even
      {0x477FE000u, 0x4780, 0x7BFF},  // 65504: float16's largest
      {0x477FEFFFu, 0x4780, 0x7BFF},  // just under 65520, where float16 rounds to infinity
      {0x477FF000u, 0x4780, 0x7C00},  // 65520: infinity
      {0x7F800000u, 0x7F80, 0x7C00},  // +inf
      {0xFF800000u, 0xFF80, 0xFC00},  // -inf
      {0x33800000u, 0x3380, 0x0001},  // 2^-24: float16's least subnormal
      {0x33000000u, 0x3300, 0x0000},  // 2^-25: a tie, to even (0)
      {0x7FC00001u, 0xFFFF, 0x7E00},  // NaNs: bf16 always 0xFFFF; float16 quiet, payload's top bits
      {0xFFC12345u, 0xFFFF, 0xFE09},
      {0x7F800001u, 0xFFFF, 0x7E00},  // signalling: made quiet
      {0x7FA00000u, 0xFFFF, 0x7F00},
      {0xFF800001u, 0xFFFF, 0xFE00},
  };
  for (const Case& c : cases) {
    float f;
    std::memcpy(&f, &c.f32, 4);
    uint16_t bf16 = 0, f16 = 0;
    ConvertFloats(DType::kFloat32, DType::kBFloat16, &f, &bf16, 1);
    ConvertFloats(DType::kFloat32, DType::kFloat16, &f, &f16, 1);
    EXPECT_EQ(bf16, c.bf16) << std::hex << c.f32;
    EXPECT_EQ(f16, c.f16) << std::hex << c.f32;
  }
}

TEST(FloatConvert, HalvesWidenExactly) {
  const uint16_t halves[] = {0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x8001};
  const uint32_t floats[] = {0x33800000u, 0x387FC000u, 0x38800000u, 0x3F800000u, 0x477FE000u, 0x7F800000u, 0xFF800000u, 0xB3800000u};
  for (size_t i = 0; i < sizeof(halves) / sizeof(halves[0]); ++i) {
    float f = 0;
    ConvertFloats(DType::kFloat16, DType::kFloat32, &halves[i], &f, 1);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    EXPECT_EQ(bits, floats[i]) << std::hex << halves[i];
    uint16_t back = 0;
    ConvertFloats(DType::kFloat32, DType::kFloat16, &f, &back, 1);
    EXPECT_EQ(back, halves[i]);
  }
}

}  // namespace
}  // namespace shardckpt
