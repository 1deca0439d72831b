#include "shardckpt/engine/model/chunk_list_text.h"

#include <cstdint>

namespace shardckpt {
namespace {

// 18 digits always fit in int64 and uint64, so no overflow test is needed per digit; longer
// numbers (rare: offsets past 10^18 bytes) are left to the general reader.
constexpr size_t kMaxDigits = 18;

// Each reader takes the position of its first character and returns the position after its text,
// or nullptr when the text there is not in the compact form. Plain pointers rather than an object
// holding one, so the position stays in a register through the digit loops.

// JSON's spelling of a non-negative integer: no sign, no leading zero, no fraction or exponent
// (the character after it must be ',' or ']', which the caller checks).
inline const char* Unsigned(const char* p, const char* end, uint64_t* value) {
  const char* start = p;
  uint64_t v = 0;
  while (p != end && static_cast<unsigned char>(*p - '0') < 10) v = v * 10 + static_cast<uint64_t>(*p++ - '0');
  const size_t digits = static_cast<size_t>(p - start);
  if (digits == 0 || digits > kMaxDigits || (digits > 1 && *start == '0')) return nullptr;
  *value = v;
  return p;
}

inline const char* Signed(const char* p, const char* end, int64_t* value) {
  const bool negative = p != end && *p == '-';
  uint64_t magnitude = 0;
  p = Unsigned(p + negative, end, &magnitude);
  *value = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  return p;
}

inline const char* Char(const char* p, const char* end, char c) { return p != nullptr && p != end && *p == c ? p + 1 : nullptr; }

// `[` integers separated by `,` `]`, possibly empty (a 0-d tensor's box).
const char* IntList(const char* p, const char* end, Dims* out) {
  if ((p = Char(p, end, '[')) == nullptr) return nullptr;
  if (p != end && *p == ']') return p + 1;
  while (true) {
    int64_t v = 0;
    if ((p = Signed(p, end, &v)) == nullptr || p == end) return nullptr;
    out->push_back(v);
    if (*p == ']') return p + 1;
    if (*p++ != ',') return nullptr;
  }
}

const char* Chunk(const char* p, const char* end, ChunkRecord* chunk) {
  uint64_t file = 0;
  if ((p = Char(p, end, '[')) == nullptr) return nullptr;
  p = Char(Unsigned(p, end, &file), end, ',');
  if (p == nullptr || file > UINT32_MAX) return nullptr;
  chunk->file = static_cast<uint32_t>(file);
  p = Char(Unsigned(p, end, &chunk->offset), end, ',');
  if (p != nullptr) p = Char(Unsigned(p, end, &chunk->bytes), end, ',');
  if (p == nullptr || p == end) return nullptr;
  Layout& layout = chunk->layout;
  if (*p == '[') {
    layout.kind = LayoutKind::kBox;
    p = Char(IntList(p, end, &layout.offsets), end, ',');
    if (p != nullptr) p = IntList(p, end, &layout.sizes);
  } else {
    layout.kind = LayoutKind::kFlatRange;
    p = Char(Signed(p, end, &layout.begin), end, ',');
    if (p != nullptr) p = Signed(p, end, &layout.end);
  }
  return Char(p, end, ']');
}

}  // namespace

size_t ReadCompactChunkList(std::string_view text, std::vector<ChunkRecord>* out) {
  const char* const begin = text.data();
  const char* const end = begin + text.size();
  const char* p = Char(begin, end, '[');
  if (p == nullptr) return 0;
  if (p != end && *p == ']') return 2;
  while (true) {
    out->emplace_back();
    if ((p = Chunk(p, end, &out->back())) == nullptr || p == end) return 0;
    if (*p == ']') return static_cast<size_t>(p + 1 - begin);
    if (*p++ != ',') return 0;
  }
}

}  // namespace shardckpt
