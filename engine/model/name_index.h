// Tensor names to their indices: a flat, open-addressed table of 8-byte slots.
//
// Why not std::unordered_map<std::string_view, size_t>: a state dict has tens of thousands of
// names, and a load indexes the manifest's names and looks each one up once, cold. The node map
// costs a malloc per name and, per lookup, a bucket read, a node read and the name compare, each a
// cache miss. Here a slot holds 32 bits of the name's hash and the index; a lookup reads one slot
// (rarely two) and compares only the name whose hash bits match. The slots of 20,000 names take
// 256 KiB, which stays in cache; a table of (hash, view, index) took 2 MiB of fresh pages, and
// faulting them in cost more than the lookups (issue 14 part 5).
//
// The table holds indices, not names: `name_of(index)` gives the name stored under an index, so
// whatever holds the names (a manifest's entries, a state's pieces) must outlive the table and
// not move them.
#pragma once

#include <cassert>
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

// `Hash` is a parameter so that tests can put every name on one hash.
template <typename NameOf, typename Hash = Xxh3NameHash>
class NameIndex {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  // Sized for `expected` names without growing.
  NameIndex(size_t expected, NameOf name_of) : name_of_(std::move(name_of)) { Rehash(SlotsFor(expected)); }

  // Adds name -> index (below kAbsent) unless the name is there. Returns the index the table
  // holds for the name and whether it was added (as std::unordered_map::try_emplace). Until a
  // later call, `name_of(index)` need not give the name yet.
  std::pair<uint32_t, bool> TryEmplace(std::string_view name, uint32_t index) {
    assert(index != kAbsent);
    if (4 * (size_ + 1) > 3 * slots_.size()) Rehash(2 * slots_.size());
    const uint64_t hash = Hash{}(name);
    Slot& slot = slots_[Probe(hash, name)];
    if (slot.index != kAbsent) return {slot.index, false};
    slot = Slot{Tag(hash), index};
    ++size_;
    return {index, true};
  }

  // The index held for `name`, or kAbsent.
  uint32_t Find(std::string_view name) const { return Find(name, HashOf(name)); }

  // For a caller that pipelines many independent lookups (MatchPieces): each lookup of a cold
  // name misses cache several times in a row, and these let the misses of the lookups a few
  // places ahead start before this one's result is needed.
  static uint64_t HashOf(std::string_view name) { return Hash{}(name); }
  // Find, given HashOf(name).
  uint32_t Find(std::string_view name, uint64_t hash) const { return slots_[Probe(hash, name)].index; }
  // Starts loading the slot where a lookup of `hash` begins.
  void PrefetchSlot(uint64_t hash) const { __builtin_prefetch(&slots_[static_cast<size_t>(hash) & (slots_.size() - 1)]); }
  // The index Find most likely returns for `hash` (the first slot of its probe run with its tag,
  // no name compared), for prefetching what the caller holds under it; kAbsent if none.
  uint32_t LikelyIndex(uint64_t hash) const {
    const size_t mask = slots_.size() - 1;
    const uint32_t tag = Tag(hash);
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
      const Slot& slot = slots_[i];
      if (slot.index == kAbsent || slot.tag == tag) return slot.index;
    }
  }

  size_t size() const { return size_; }

  // Room for `names` names without growing (a writer told how many entries it will get).
  void Reserve(size_t names) {
    if (SlotsFor(names) > slots_.size()) Rehash(SlotsFor(names));
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    uint32_t index = kAbsent;  // kAbsent: an empty slot
  };

  static uint32_t Tag(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }
  static size_t SlotsFor(size_t names) {
    size_t slots = 16;
    while (3 * slots < 4 * names) slots *= 2;  // at most 3/4 full: short probe runs
    return slots;
  }

  // The slot holding `name`, or the empty slot where it would go.
  size_t Probe(uint64_t hash, std::string_view name) const {
    const size_t mask = slots_.size() - 1;
    const uint32_t tag = Tag(hash);
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
      const Slot& slot = slots_[i];
      if (slot.index == kAbsent || (slot.tag == tag && name_of_(slot.index) == name)) return i;
    }
  }

  // Slots keep only 32 bits of each hash, so growing hashes the names again (a table sized for
  // its names up front never grows; a save plan's grows when later ranks name more entries).
  void Rehash(size_t slots) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(slots, Slot{});
    const size_t mask = slots - 1;
    for (const Slot& s : old) {
      if (s.index == kAbsent) continue;
      size_t i = static_cast<size_t>(Hash{}(name_of_(s.index))) & mask;
      while (slots_[i].index != kAbsent) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  NameOf name_of_;
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace shardckpt
