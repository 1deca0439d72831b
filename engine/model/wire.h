// Bounds-checked little binary encoding for the messages ranks exchange during a save and a load
// (piece descriptions, chunk records). Never written to disk; the manifest is the on-disk format.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

// Writes the encoding into `Sink` (anything with Append(const void*, size_t)): a string for the
// messages, a hash for a rank's description digest (save_plan.h), so both see the same bytes.
template <class Sink>
class BasicWireWriter {
 public:
  void U64(uint64_t v) { sink_.Append(&v, sizeof(v)); }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(const std::string& s) {
    U64(s.size());
    sink_.Append(s.data(), s.size());
  }
  template <typename IntVector>  // Shape or Dims
  void Ints(const IntVector& v) {
    U64(v.size());
    for (int64_t x : v) I64(x);
  }
  // Variable-length (LEB128: 7 bits a byte, small numbers in one byte), for messages whose size
  // matters: the manifest a load shares holds millions of small integers.
  void Var(uint64_t v) {
    uint8_t bytes[10];
    size_t n = 0;
    for (; v >= 0x80; v >>= 7) bytes[n++] = static_cast<uint8_t>(v | 0x80);
    bytes[n++] = static_cast<uint8_t>(v);
    sink_.Append(bytes, n);
  }
  // Zigzag: small negative numbers stay short too.
  void SVar(int64_t v) { Var((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void VarStr(const std::string& s) {
    Var(s.size());
    sink_.Append(s.data(), s.size());
  }
  template <typename IntVector>  // Shape or Dims
  void VarInts(const IntVector& v) {
    Var(v.size());
    for (int64_t x : v) SVar(x);
  }
  void Layout(const shardckpt::Layout& l) {
    U64(static_cast<uint64_t>(l.kind));
    Ints(l.offsets);
    Ints(l.sizes);
    I64(l.begin);
    I64(l.end);
  }
  Sink& sink() { return sink_; }

 private:
  Sink sink_;
};

struct StringSink {
  std::string bytes;
  void Append(const void* data, size_t n) {
    const char* c = static_cast<const char*>(data);
    if (n > 16) {
      bytes.append(c, n);
      return;
    }
    // Integers, mostly one to three bytes: push_back's inline path, not a library call each.
    for (size_t i = 0; i < n; ++i) bytes.push_back(c[i]);
  }
};

class WireWriter : public BasicWireWriter<StringSink> {
 public:
  std::string& bytes() { return sink().bytes; }
};

// Positions are pointers, not indexes into the string: the compiler then keeps them in registers
// while integers are stored (an int64_t store may alias a size_t, never a pointer).
class WireReader {
 public:
  explicit WireReader(const std::string& bytes) : pos_(bytes.data()), end_(bytes.data() + bytes.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == end_; }
  // A value read was out of its range: the message is refused.
  void Fail() { ok_ = false; }
  uint64_t U64() {
    uint64_t v = 0;
    if (!Need(sizeof(v))) return 0;
    std::memcpy(&v, pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  std::string Str() { return Bytes(U64()); }
  std::vector<int64_t> Ints() {
    std::vector<int64_t> v;
    IntsInto(&v);
    return v;
  }
  uint64_t Var() {
    // Most values (sizes of small pieces, file indexes, dims) take one byte.
    if (pos_ != end_ && (static_cast<uint8_t>(*pos_) & 0x80) == 0) return static_cast<uint8_t>(*pos_++);
    uint64_t v = 0;
    // Ten bytes hold any value: with that many left, no byte needs its own bounds check.
    const bool room = end_ - pos_ >= 10;
    for (int shift = 0; shift < 64; shift += 7) {
      if (!room && !Need(1)) return 0;
      const uint8_t byte = static_cast<uint8_t>(*pos_++);
      if (shift == 63 && byte > 1) break;  // past 64 bits
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    ok_ = false;  // more than ten bytes, or more than 64 bits
    return 0;
  }
  int64_t SVar() {
    const uint64_t v = Var();
    return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
  }
  std::string VarStr() { return Bytes(Var()); }
  // A count of items that take at least `min_bytes` each: more than the bytes left hold is
  // refused, so that nothing is allocated by a number the message merely claims.
  uint64_t VarCount(uint64_t min_bytes = 1) {
    const uint64_t n = Var();
    if (n > static_cast<uint64_t>(end_ - pos_) / min_bytes) ok_ = false;
    return ok_ ? n : 0;
  }
  template <typename IntVector>  // Shape or Dims
  void VarIntsInto(IntVector* v) {
    v->clear();
    const uint64_t n = VarCount();
    v->reserve(n);
    for (uint64_t i = 0; i < n; ++i) v->push_back(SVar());
  }
  template <typename IntVector>  // Shape or Dims
  void IntsInto(IntVector* v) {
    v->clear();
    uint64_t n = U64();
    if (n > static_cast<uint64_t>(end_ - pos_) / 8) {
      ok_ = false;
      return;
    }
    v->resize(n);
    for (auto& x : *v) x = I64();
  }
  shardckpt::Layout Layout() {
    shardckpt::Layout l;
    uint64_t kind = U64();
    if (kind > 2) ok_ = false;
    l.kind = static_cast<LayoutKind>(kind);
    IntsInto(&l.offsets);
    IntsInto(&l.sizes);
    l.begin = I64();
    l.end = I64();
    return l;
  }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > static_cast<uint64_t>(end_ - pos_)) ok_ = false;
    return ok_;
  }
  std::string Bytes(uint64_t n) {
    if (!Need(n)) return {};
    std::string s(pos_, n);
    pos_ += n;
    return s;
  }
  const char* pos_;
  const char* end_;
  bool ok_ = true;
};

}  // namespace shardckpt
