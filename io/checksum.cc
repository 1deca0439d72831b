#include "shardckpt/io/checksum.h"

// The streaming state on the stack (no allocation to fail) needs its definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstdio>

namespace shardckpt {

uint64_t Checksum64(const void* data, size_t len) { return XXH3_64bits(data, len); }

uint64_t Checksum64(std::initializer_list<std::string_view> pieces) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (std::string_view piece : pieces) XXH3_64bits_update(&state, piece.data(), piece.size());
  return XXH3_64bits_digest(&state);
}

void ChecksumBlocks(const void* data, size_t len, uint64_t* out) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i * kBlockSize < len; ++i) {
    out[i] = XXH3_64bits(bytes + i * kBlockSize, kBlockSize);
  }
}

std::string Hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return std::string(buf, 16);
}

bool ParseHex64(const std::string& text, uint64_t* value) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *value = v;
  return true;
}

}  // namespace shardckpt
