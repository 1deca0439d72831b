// GGUF version 3 (the file format of llama.cpp and ggml, docs/format.md "GGUF"): the header
// (magic, version, tensor and key counts), typed metadata key/values, one tensor info per tensor
// (name, dims innermost first, ggml type, offset into the data section), padding to the
// alignment, then each tensor's bytes padded to the alignment. F32, F16 and BF16 only: tensors
// are written as they are, never quantized. Pure: consolidate (engine/core/consolidate.h)
// streams the tensor data after the header this encodes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

inline constexpr uint64_t kGgufAlignment = 32;  // recorded as general.alignment
// ggml's limits: GGML_MAX_NAME (63 bytes and a NUL) and GGML_MAX_DIMS.
inline constexpr size_t kGgufMaxName = 63;
inline constexpr size_t kGgufMaxDims = 4;

struct GgufValue {
  enum class Kind : uint8_t { kString, kInt, kFloat, kBool };
  Kind kind = Kind::kString;
  std::string text;
  int64_t integer = 0;  // written as UINT32 when it fits, INT32 when negative and fits, else INT64
  double real = 0;      // written as FLOAT32, as llama.cpp reads its float keys
  bool flag = false;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;  // torch order (outermost first); the file lists it reversed
};

// A flat JSON object of string, integer, float and bool values (--gguf-metadata FILE).
Result<std::vector<GgufKeyValue>> ParseGgufMetadataJson(const std::string& json, const std::string& origin);

// general.architecture and general.name (when given: empty means not given) first, winning over
// the same keys of `others`, then the other keys of `others` in their order.
std::vector<GgufKeyValue> GgufMetadataWith(const std::string& architecture, const std::string& name,
                                           const std::vector<GgufKeyValue>& others);

// Refuses a dtype GGUF output does not hold, a name ggml cannot take, or more dims than ggml has,
// naming the tensor.
Status CheckGgufTensor(const GgufTensorInfo& tensor);

// Everything before the first tensor's bytes, padded to the alignment. `metadata` must hold
// general.architecture; general.alignment is added. Tensor i's data starts at the sum of the
// padded sizes of the tensors before it.
Result<std::string> EncodeGgufHeader(const std::vector<GgufKeyValue>& metadata, const std::vector<GgufTensorInfo>& tensors);

// Zero bytes that follow `bytes` of tensor data to reach the alignment.
inline uint64_t GgufPadding(uint64_t bytes) { return (kGgufAlignment - bytes % kGgufAlignment) % kGgufAlignment; }

}  // namespace shardckpt
