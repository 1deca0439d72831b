#include "shardckpt/engine/model/float_convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardckpt {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0) return Bits(sign) + (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return Bits(sign | 0x7F800000u | (mant << 13));
  return Bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  uint32_t u = Bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  // As torch 2.x's vectorized kernel on x86 (F16C's conversion): quiet, the payload's top bits
  // kept (torch 1.13 gave sign | 0x7E00).
  if (std::isnan(f)) return sign | 0x7E00 | static_cast<uint16_t>((u & 0x7FFFFFu) >> 13);
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal half: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  uint32_t m = Bits(a);
  uint32_t rounded = m + 0xFFFu + ((m >> 13) & 1u);  // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

float BF16ToFloat(uint16_t b) { return Bits(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBF16(float f) {
  uint32_t u = Bits(f);
  // As torch's vectorized CPU kernel converts (measured with torch 1.13 and 2.15 on x86, contiguous
  // tensors of 5 and 64 elements): every NaN becomes 0xFFFF, whatever its sign and payload. Its
  // scalar path (c10::BFloat16) gives 0x7FC0 instead; no single answer is torch's.
  if (std::isnan(f)) return 0xFFFF;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Load(DType dtype, const unsigned char* p) {
  switch (dtype) {
    case DType::kFloat64: { double d; std::memcpy(&d, p, 8); return static_cast<float>(d); }
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return HalfToFloat(h); }
    case DType::kBFloat16: { uint16_t b; std::memcpy(&b, p, 2); return BF16ToFloat(b); }
    default: return 0;
  }
}

void Store(DType dtype, float f, unsigned char* p) {
  switch (dtype) {
    case DType::kFloat64: { double d = f; std::memcpy(p, &d, 8); break; }
    case DType::kFloat32: std::memcpy(p, &f, 4); break;
    case DType::kFloat16: { uint16_t h = FloatToHalf(f); std::memcpy(p, &h, 2); break; }
    case DType::kBFloat16: { uint16_t b = FloatToBF16(f); std::memcpy(p, &b, 2); break; }
    default: break;
  }
}

}  // namespace

bool IsFloatingDType(DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

void ConvertFloats(DType from, DType to, const void* in, void* out, size_t count) {
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  const size_t a = DTypeSize(from), b = DTypeSize(to);
  for (size_t i = 0; i < count; ++i) Store(to, Load(from, src + i * a), dst + i * b);
}

}  // namespace shardckpt
