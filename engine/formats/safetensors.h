// safetensors headers (docs/format.md): [u64 N][N bytes JSON][data]. The encoder pads
// the header with spaces to a multiple of 8; the parser applies the reference reader's rules:
// N <= 100,000,000, known dtypes, byte lengths equal to numel x element size, entries tiling the
// data exactly from 0 with no gaps or overlaps, and nothing after the last byte.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0;  // relative to the data start
  uint64_t end = 0;
};

// Offsets are assigned in order; returns the 8-byte length prefix plus the padded header.
Result<std::string> EncodeSafetensorsHeader(std::vector<SafetensorsEntry>& entries,
                                            const std::map<std::string, std::string>& metadata);
inline constexpr uint64_t kMaxSafetensorsHeader = 100000000;
// `header_json` is the N bytes after the prefix; `data_bytes` = file size - 8 - N. `metadata`,
// where given, gets the header's __metadata__ (string to string, as the format defines it).
Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& header_json, uint64_t data_bytes,
                                                             const std::string& origin,
                                                             std::map<std::string, std::string>* metadata = nullptr);
// The manifest's creation key (CreationInfo::user) under which import keeps a safetensors file's
// __metadata__ (a JSON object), for consolidate to write back into safetensors output.
inline constexpr const char* kSafetensorsMetadataKey = "safetensors_metadata";

}  // namespace shardckpt
