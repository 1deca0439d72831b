#include "shardckpt/engine/model/utf8_text.h"

namespace shardckpt {
namespace {

// `text` with each byte that starts no valid UTF-8 sequence (always >= 0x80: ASCII is valid)
// replaced by what `replace(byte)` spells.
template <typename Replace>
std::string ReplaceInvalidBytes(std::string_view text, Replace replace) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      replace(static_cast<unsigned char>(text[i]), &out);
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    if (i + k >= s.size()) return false;
    unsigned c = static_cast<unsigned char>(s[i + k]);
    return c >= lo && c <= hi;
  };
  unsigned c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

bool IsUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8OrReplaced(std::string_view text) {
  return ReplaceInvalidBytes(text, [](unsigned, std::string* out) { out->append("\xEF\xBF\xBD"); });
}

std::string PythonPathText(std::string_view path) {
  return ReplaceInvalidBytes(path, [](unsigned byte, std::string* out) {  // U+DC00 + byte, in UTF-8
    out->push_back(static_cast<char>(0xED));
    out->push_back(static_cast<char>(0xB0 | (byte >> 6)));
    out->push_back(static_cast<char>(0x80 | (byte & 0x3F)));
  });
}

}  // namespace shardckpt
