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
  void Append(const void* data, size_t n) { bytes.append(static_cast<const char*>(data), n); }
};

class WireWriter : public BasicWireWriter<StringSink> {
 public:
  std::string& bytes() { return sink().bytes; }
};

class WireReader {
 public:
  explicit WireReader(const std::string& bytes) : bytes_(bytes) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == bytes_.size(); }
  uint64_t U64() {
    uint64_t v = 0;
    if (!Need(sizeof(v))) return 0;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  std::string Str() {
    uint64_t n = U64();
    if (!Need(n)) return {};
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::vector<int64_t> Ints() {
    std::vector<int64_t> v;
    IntsInto(&v);
    return v;
  }
  template <typename IntVector>  // Shape or Dims
  void IntsInto(IntVector* v) {
    v->clear();
    uint64_t n = U64();
    if (!Need(n * 8) || n > bytes_.size()) return;
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
    if (!ok_ || n > bytes_.size() - pos_) ok_ = false;
    return ok_;
  }
  const std::string& bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace shardckpt
