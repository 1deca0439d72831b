// Element types a checkpoint can hold, with the names each format spells them by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardckpt/io/status.h"

namespace shardckpt {

enum class DType : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kFloat8E4M3,
  kFloat8E5M2,
  // Appended, never reordered: rank descriptions carry the enum's value.
  kUInt16,
  kUInt32,
  kUInt64,
  kComplex64,
  kComplex128,
};
inline constexpr int kNumDTypes = 17;

size_t DTypeSize(DType dtype);
// Manifest name: "float32", "bfloat16", "float8_e4m3fn", ...
const char* DTypeName(DType dtype);
Result<DType> ParseDType(std::string_view name);
// safetensors header name: "F32", "BF16", "F8_E4M3", ...; nullptr where safetensors (0.8) has
// none (complex128).
const char* SafetensorsDTypeName(DType dtype);
Result<DType> ParseSafetensorsDType(const std::string& name);
// torch's legacy typed storage class in a torch.save pickle: "FloatStorage", "BFloat16Storage",
// ...; nullptr for the dtypes that have none (float8, uint16/32/64), which torch >= 2.1 writes as
// an UntypedStorage rebuilt by _rebuild_tensor_v3 naming the dtype. torch 1.13 has none of those.
const char* TorchStorageName(DType dtype);
Result<DType> ParseTorchStorageName(const std::string& name);

}  // namespace shardckpt
