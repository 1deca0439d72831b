// Byte sizes as people type them on command lines: "5GB", "500MiB", "4096", "2G".
#pragma once

#include <cstdint>
#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

// Decimal units (KB, MB, GB) are powers of 1000; binary ones (KiB, MiB, GiB and the short K/k,
// M, G) powers of 1024; no unit or "B" is bytes. Zero, negative and unknown units are refused.
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace shardckpt
