#include "shardckpt/engine/model/json_text.h"

#include <charconv>
#include <cmath>

#include "shardckpt/engine/model/utf8_text.h"

namespace shardckpt {
bool AppendJsonString(std::string* out, std::string_view text) {
  const size_t start = out->size();
  out->push_back('"');
  size_t plain = 0;  // start of the run not yet copied
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      size_t n = Utf8SequenceLength(text, i);
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
