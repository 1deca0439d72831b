#include "shardckpt/io/checksum.h"

// The streaming state on the stack (no allocation to fail) needs its definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstdio>

#if SHARDCKPT_HAVE_XXH3_DISPATCH
// libxxhash's plain entry points are built for the distribution's baseline CPU (SSE2 on x86-64);
// its *_dispatch ones pick AVX2 or AVX-512 at run time. A 4096-byte block in cache hashes at about
// 63 GB/s through them against 18 GB/s (AVX-512 Xeon), and every byte a save writes or a load
// verifies is hashed. XXH3's value does not depend on the vector width, so files stay the same.
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#endif

namespace shardckpt {
namespace {

#if SHARDCKPT_HAVE_XXH3_DISPATCH
inline uint64_t Xxh3(const void* data, size_t len) { return XXH3_64bits_dispatch(data, len); }
inline void Xxh3Update(XXH3_state_t* state, const void* data, size_t len) { XXH3_64bits_update_dispatch(state, data, len); }
#else
inline uint64_t Xxh3(const void* data, size_t len) { return XXH3_64bits(data, len); }
inline void Xxh3Update(XXH3_state_t* state, const void* data, size_t len) { XXH3_64bits_update(state, data, len); }
#endif

}  // namespace

uint64_t Checksum64(const void* data, size_t len) { return Xxh3(data, len); }

uint64_t Checksum64(std::initializer_list<std::string_view> pieces) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (std::string_view piece : pieces) Xxh3Update(&state, piece.data(), piece.size());
  return XXH3_64bits_digest(&state);
}

void ChecksumBlocks(const void* data, size_t len, uint64_t* out) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i * kBlockSize < len; ++i) {
    out[i] = Xxh3(bytes + i * kBlockSize, kBlockSize);
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
