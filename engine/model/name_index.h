// Tensor names to indices: one flat, open-addressed table of (hash, name view, value).
//
// Why not std::unordered_map<std::string_view, size_t>: a state dict has tens of thousands of
// names, and at load a manifest's names are indexed and looked up once each, cold. The node map
// costs a malloc per name and, per lookup, a bucket read, a node read and the name compare, each a
// cache miss; here a lookup is one slot read (the hash is stored, so most probes end without
// touching a name) and the one name compare that confirms it. Matching 20,004 names this way is
// what a load of many small tensors spends its match phase on (issue 14 part 5).
//
// The names are views: whatever holds them must outlive the index. Values are whatever the caller
// indexes by (entry or piece numbers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include <xxhash.h>

namespace shardckpt {

struct Xxh3NameHash {
  uint64_t operator()(std::string_view name) const { return XXH3_64bits(name.data(), name.size()); }
};

// `Hash` is a parameter so that tests can force every name onto one hash.
template <typename Hash = Xxh3NameHash>
class BasicNameIndex {
 public:
  static constexpr size_t kAbsent = SIZE_MAX;

  // Sized for `expected` names without growing.
  explicit BasicNameIndex(size_t expected = 0) { Rehash(SlotsFor(expected)); }

  // Adds name -> value (any value but kAbsent) unless the name is there. Returns the value the index holds for the name
  // and whether it was added (as std::unordered_map::try_emplace).
  std::pair<size_t, bool> TryEmplace(std::string_view name, size_t value) {
    if (2 * (size_ + 1) > slots_.size()) Rehash(2 * slots_.size());
    const uint64_t hash = Hash{}(name);
    Slot* slot = Probe(hash, name);
    if (slot->used()) return {slot->value, false};
    *slot = Slot{hash, name, value};
    ++size_;
    return {value, true};
  }

  // The value held for `name`, or kAbsent.
  size_t Find(std::string_view name) const {
    const Slot* slot = const_cast<BasicNameIndex*>(this)->Probe(Hash{}(name), name);
    return slot->value;  // kAbsent in an empty slot
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::string_view name;
    size_t value = kAbsent;  // kAbsent: an empty slot (32 bytes a slot, no flag)
    bool used() const { return value != kAbsent; }
  };

  static size_t SlotsFor(size_t names) {
    size_t slots = 16;
    while (slots < 2 * names) slots *= 2;  // load factor at most 1/2: short probe runs
    return slots;
  }

  // The slot holding `name`, or the empty slot where it would go.
  Slot* Probe(uint64_t hash, std::string_view name) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (!slot.used() || (slot.hash == hash && slot.name == name)) return &slot;
    }
  }

  void Rehash(size_t slots) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(slots, Slot{});
    const size_t mask = slots - 1;
    for (const Slot& s : old) {
      if (!s.used()) continue;
      size_t i = static_cast<size_t>(s.hash) & mask;
      while (slots_[i].used()) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

using NameIndex = BasicNameIndex<>;

}  // namespace shardckpt
