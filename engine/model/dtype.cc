#include "shardckpt/engine/model/dtype.h"

namespace shardckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  const char* name;
  const char* safetensors;
  const char* torch_storage;
};

constexpr DTypeInfo kInfo[kNumDTypes] = {
    {DType::kFloat64, 8, "float64", "F64", "DoubleStorage"},
    {DType::kFloat32, 4, "float32", "F32", "FloatStorage"},
    {DType::kFloat16, 2, "float16", "F16", "HalfStorage"},
    {DType::kBFloat16, 2, "bfloat16", "BF16", "BFloat16Storage"},
    {DType::kInt64, 8, "int64", "I64", "LongStorage"},
    {DType::kInt32, 4, "int32", "I32", "IntStorage"},
    {DType::kInt16, 2, "int16", "I16", "ShortStorage"},
    {DType::kInt8, 1, "int8", "I8", "CharStorage"},
    {DType::kUInt8, 1, "uint8", "U8", "ByteStorage"},
    {DType::kBool, 1, "bool", "BOOL", "BoolStorage"},
    {DType::kFloat8E4M3, 1, "float8_e4m3fn", "F8_E4M3", nullptr},
    {DType::kFloat8E5M2, 1, "float8_e5m2", "F8_E5M2", nullptr},
    {DType::kUInt16, 2, "uint16", "U16", nullptr},
    {DType::kUInt32, 4, "uint32", "U32", nullptr},
    {DType::kUInt64, 8, "uint64", "U64", nullptr},
    {DType::kComplex64, 8, "complex64", "C64", "ComplexFloatStorage"},
    {DType::kComplex128, 16, "complex128", nullptr, "ComplexDoubleStorage"},
};

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<int>(dtype)]; }

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }
const char* DTypeName(DType dtype) { return Info(dtype).name; }
const char* SafetensorsDTypeName(DType dtype) { return Info(dtype).safetensors; }
const char* TorchStorageName(DType dtype) { return Info(dtype).torch_storage; }

Result<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (name == info.name) return info.dtype;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

Result<DType> ParseSafetensorsDType(const std::string& name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.safetensors && name == info.safetensors) return info.dtype;
  }
  return InvalidArgument("unsupported safetensors dtype '" + name + "'");
}

Result<DType> ParseTorchStorageName(const std::string& name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.torch_storage && name == info.torch_storage) return info.dtype;
  }
  return InvalidArgument("unsupported torch storage type '" + name + "'");
}

}  // namespace shardckpt
