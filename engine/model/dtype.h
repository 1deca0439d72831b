// Element types a checkpoint can hold, with the names each format spells them by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
};
inline constexpr int kNumDTypes = 12;

size_t DTypeSize(DType dtype);
// Manifest name: "float32", "bfloat16", "float8_e4m3fn", ...
const char* DTypeName(DType dtype);
Result<DType> ParseDType(const std::string& name);
// safetensors header name: "F32", "BF16", "F8_E4M3", ...
const char* SafetensorsDTypeName(DType dtype);
Result<DType> ParseSafetensorsDType(const std::string& name);
// torch storage class in a torch.save pickle: "FloatStorage", "BFloat16Storage", ... (the float8
// names are the ones torch >= 2.1 writes; torch 1.13 cannot read float8 at all).
const char* TorchStorageName(DType dtype);
Result<DType> ParseTorchStorageName(const std::string& name);

}  // namespace shardckpt
