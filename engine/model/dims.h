// A short list of int64 (a box's offsets or sizes) stored inline up to four dims.
//
// Why: a manifest of a few million chunks holds one Layout per chunk, and with two std::vectors
// per Box each decode made two heap allocations per chunk (6 million for 3 million chunks: a
// third of the decode's time in malloc and free, issue 14 part 5). Almost every box has 1 to 4
// dims; more spill to the heap. It converts to and from std::vector<int64_t> (Shape), so code
// that treats a box as a Shape reads the same. Not boost::container::small_vector<int64_t, 4>:
// that is 56 bytes, this 40 (the inline dims share their space with the heap pointer), 32 bytes
// less per chunk, about 100 MB at 3 million chunks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace shardckpt {

class Dims {
 public:
  static constexpr uint32_t kInline = 4;

  Dims() = default;
  Dims(std::initializer_list<int64_t> values) { assign(values.begin(), values.end()); }
  Dims(const std::vector<int64_t>& values) { assign(values.data(), values.data() + values.size()); }  // NOLINT: implicit
  Dims(const Dims& other) { assign(other.begin(), other.end()); }
  Dims(Dims&& other) noexcept { MoveFrom(other); }
  Dims& operator=(const Dims& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Dims& operator=(Dims&& other) noexcept {
    if (this != &other) {
      Free();
      MoveFrom(other);
    }
    return *this;
  }
  Dims& operator=(const std::vector<int64_t>& values) {
    assign(values.data(), values.data() + values.size());
    return *this;
  }
  ~Dims() { Free(); }

  operator std::vector<int64_t>() const { return std::vector<int64_t>(begin(), end()); }  // NOLINT: implicit

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return OnHeap() ? heap_ : inline_; }
  const int64_t* data() const { return OnHeap() ? heap_ : inline_; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& front() { return data()[0]; }
  int64_t front() const { return data()[0]; }
  int64_t& back() { return data()[size_ - 1]; }
  int64_t back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > capacity_) Grow(n);
  }
  void resize(size_t n, int64_t value = 0) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = value;
    size_ = static_cast<uint32_t>(n);
  }
  void push_back(int64_t value) {
    if (size_ == capacity_) Grow(std::max<size_t>(2 * capacity_, kInline));
    data()[size_++] = value;
  }
  template <typename It>
  void assign(It first, It last) {
    const size_t n = static_cast<size_t>(std::distance(first, last));
    size_ = 0;
    reserve(n);
    std::copy(first, last, data());
    size_ = static_cast<uint32_t>(n);
  }

  friend bool operator==(const Dims& a, const Dims& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }
  // Against a Shape without building a Dims from it (Normalize and inspect compare a box's
  // sizes with its entry's shape once per chunk).
  friend bool operator==(const Dims& a, const std::vector<int64_t>& b) {
    return a.size_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const std::vector<int64_t>& a, const Dims& b) { return b == a; }
  friend bool operator!=(const Dims& a, const std::vector<int64_t>& b) { return !(a == b); }
  friend bool operator!=(const std::vector<int64_t>& a, const Dims& b) { return !(b == a); }

 private:
  bool OnHeap() const { return capacity_ > kInline; }
  void Grow(size_t n) {
    int64_t* grown = new int64_t[n];
    if (size_ > 0) std::memcpy(grown, data(), size_ * sizeof(int64_t));
    Free();
    heap_ = grown;
    capacity_ = static_cast<uint32_t>(n);
  }
  void Free() {
    if (OnHeap()) delete[] heap_;
    capacity_ = kInline;
  }
  // `this` holds nothing on the heap.
  void MoveFrom(Dims& other) {
    size_ = other.size_;
    if (other.OnHeap()) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
      other.capacity_ = kInline;
    } else {
      std::memcpy(inline_, other.inline_, size_ * sizeof(int64_t));
      capacity_ = kInline;
    }
    other.size_ = 0;
  }

  union {
    int64_t inline_[kInline];
    int64_t* heap_;
  };
  uint32_t size_ = 0;
  uint32_t capacity_ = kInline;
};

}  // namespace shardckpt
