// Checksums of data-file blocks. Every 4096-byte block of a data file has its own 64-bit XXH3,
// because 4096 is also the O_DIRECT read unit: a resharded load that reads a few blocks out of a
// chunk verifies exactly the blocks it read, with no extra bytes read for verification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace shardckpt {

inline constexpr uint64_t kBlockSize = 4096;

uint64_t Checksum64(const void* data, size_t len);
// The Checksum64 of `pieces` one after the other, without joining them (a manifest's text is
// sealed over pieces that stand apart: a kept body, a closing brace).
uint64_t Checksum64(std::initializer_list<std::string_view> pieces);
// Checksums `len` bytes (a multiple of kBlockSize) block by block into out[len / kBlockSize].
void ChecksumBlocks(const void* data, size_t len, uint64_t* out);

std::string Hex64(uint64_t value);
bool ParseHex64(const std::string& text, uint64_t* value);

inline uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
inline uint64_t AlignDown(uint64_t value, uint64_t alignment) {
  return value / alignment * alignment;
}

}  // namespace shardckpt
