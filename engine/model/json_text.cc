#include "shardckpt/engine/model/json_text.h"

#include <charconv>
#include <cmath>

namespace shardckpt {
namespace {

// Length of the UTF-8 sequence starting at `s[i]`, or 0 when it is not a valid one (overlong
// forms, surrogates and code points past U+10FFFF refused, as RFC 3629 requires).
size_t Utf8Length(std::string_view s, size_t i) {
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

// `text` with each byte that starts no valid UTF-8 sequence (always >= 0x80: ASCII is valid)
// replaced by what `replace(byte)` spells.
template <typename Replace>
std::string ReplaceInvalidBytes(std::string_view text, Replace replace) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8Length(text, i);
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

bool AppendJsonString(std::string* out, std::string_view text) {
  const size_t start = out->size();
  out->push_back('"');
  size_t plain = 0;  // start of the run not yet copied
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      size_t n = Utf8Length(text, i);
      if (n == 0) {
        out->resize(start);
        return false;
      }
      i += n;
      continue;
    }
    if (c >= 0x20 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    out->append(text.data() + plain, i - plain);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default: {
        static const char kHex[] = "0123456789abcdef";
        const char escaped[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        out->append(escaped, 6);
      }
    }
    plain = ++i;
  }
  out->append(text.data() + plain, text.size() - plain);
  out->push_back('"');
  return true;
}

// Appended as (pointer, count): append(first, last) goes through string's generic replace, which
// took a tenth of a manifest's encode (millions of numbers).
void AppendJsonUint(std::string* out, uint64_t value) {
  char buffer[24];
  std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, static_cast<size_t>(r.ptr - buffer));
}

void AppendJsonInt(std::string* out, int64_t value) {
  char buffer[24];
  std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, static_cast<size_t>(r.ptr - buffer));
}

void AppendJsonDouble(std::string* out, double value) {
  if (!std::isfinite(value)) {
    out->append("null");
    return;
  }
  char buffer[32];
  std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, static_cast<size_t>(r.ptr - buffer));
  for (const char* p = buffer; p != r.ptr; ++p) {
    if (*p == '.' || *p == 'e') return;
  }
  out->append(".0");
}

}  // namespace shardckpt
