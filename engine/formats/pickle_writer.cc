#include "shardckpt/engine/formats/pickle_writer.h"

#include <cstring>

namespace shardckpt {

PickleWriter::PickleWriter(int protocol) {
  s_ += '\x80';
  s_ += static_cast<char>(protocol);
}

void PickleWriter::Int(int64_t v) {
  if (v >= 0 && v < 256) {
    s_ += 'K';
    s_ += static_cast<char>(v);
  } else if (v >= 0 && v < 65536) {
    s_ += 'M';
    s_ += static_cast<char>(v & 0xFF);
    s_ += static_cast<char>(v >> 8);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    s_ += 'J';
    int32_t x = static_cast<int32_t>(v);
    s_.append(reinterpret_cast<const char*>(&x), 4);
  } else {
    s_ += '\x8a';  // LONG1: little-endian two's complement
    s_ += '\x08';
    s_.append(reinterpret_cast<const char*>(&v), 8);
  }
}

void PickleWriter::UInt(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return Int(static_cast<int64_t>(v));
  s_ += '\x8a';  // a ninth, zero byte keeps it positive
  s_ += '\x09';
  s_.append(reinterpret_cast<const char*>(&v), 8);
  s_ += '\0';
}

void PickleWriter::Float(double v) {
  s_ += 'G';  // BINFLOAT: big-endian IEEE 754
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  for (int i = 7; i >= 0; --i) s_ += static_cast<char>((bits >> (8 * i)) & 0xFF);
}

void PickleWriter::String(const std::string& utf8) {
  s_ += 'X';  // BINUNICODE
  uint32_t n = static_cast<uint32_t>(utf8.size());
  s_.append(reinterpret_cast<const char*>(&n), 4);
  s_ += utf8;
}

void PickleWriter::Bytes(const std::string& bytes) {
  s_ += 'B';  // BINBYTES
  uint32_t n = static_cast<uint32_t>(bytes.size());
  s_.append(reinterpret_cast<const char*>(&n), 4);
  s_ += bytes;
}

void PickleWriter::Global(const std::string& module, const std::string& name) {
  s_ += 'c';
  s_ += module;
  s_ += '\n';
  s_ += name;
  s_ += '\n';
}

void PickleWriter::IntTuple(const std::vector<int64_t>& values) {
  if (values.empty()) return EmptyTuple();
  Mark();
  for (int64_t v : values) Int(v);
  Tuple();
}

void PickleWriter::NewObject(const std::string& module, const std::string& name) {
  Global(module, name);
  EmptyTuple();
  NewObj();
}

std::string PickleWriter::Finish() {
  s_ += '.';
  return std::move(s_);
}

}  // namespace shardckpt
