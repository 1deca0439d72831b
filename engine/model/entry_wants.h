// What each rank wants of each checkpoint entry, and what all ranks' wants decide (load step 2,
// docs/architecture.md): which entries someone loads, and which every rank wants whole, so one
// rank reads them and broadcasts. One byte per entry on the wire, all-gathered between ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardckpt {

struct EntryWant {
  bool wanted = false;  // some target piece names the entry
  bool whole = false;   // a piece wants the whole tensor
  bool part = false;    // a piece wants part of it
  // This rank's first whole piece of the entry is in device memory (the one a broadcast fills).
  bool whole_on_device = false;
  // This rank reads the entry into a buffer of its own, to compare with the tensor it is tied to
  // (engine/core/tied_targets.h): the load then agrees on that comparison at its end.
  bool compared = false;

  // Records one target piece of the entry.
  void Add(bool whole_piece, bool on_device) {
    if (whole_piece && !whole && on_device) whole_on_device = true;
    wanted = true;
    (whole_piece ? whole : part) = true;
  }

  enum Bit : uint8_t { kWanted = 1, kWhole = 2, kPart = 4, kWholeOnDevice = 8, kCompared = 16 };
  char Encode() const {
    return static_cast<char>((wanted ? kWanted : 0) | (whole ? kWhole : 0) | (part ? kPart : 0) |
                             (whole_on_device ? kWholeOnDevice : 0) | (compared ? kCompared : 0));
  }
  static EntryWant Decode(char byte) {
    const auto b = static_cast<uint8_t>(byte);
    EntryWant w;
    w.wanted = b & kWanted;
    w.whole = b & kWhole;
    w.part = b & kPart;
    w.whole_on_device = b & kWholeOnDevice;
    w.compared = b & kCompared;
    return w;
  }
};

inline std::string EncodeEntryWants(const std::vector<EntryWant>& wants) {
  std::string out;
  for (const EntryWant& w : wants) out += w.Encode();
  return out;
}

// Per entry, over every rank's encoded wants (a rank's missing bytes count as wanting nothing).
struct AllRanksWant {
  std::vector<bool> any;                        // some rank loads it
  std::vector<bool> whole_by_all;               // every rank wants it whole and no rank a part
  std::vector<bool> whole_on_device_everywhere;  // every rank's whole piece is in device memory
  std::vector<bool> whole_by_some;              // some rank wants it whole
  bool compared_anywhere = false;               // some rank compares a tied pair (EntryWant::compared)
};

inline AllRanksWant CombineEntryWants(const std::vector<std::string>& per_rank, size_t entries) {
  AllRanksWant all{std::vector<bool>(entries, false), std::vector<bool>(entries, true),
                   std::vector<bool>(entries, true), std::vector<bool>(entries, false)};
  for (const std::string& bytes : per_rank) {
    for (size_t i = 0; i < entries; ++i) {
      const EntryWant w = EntryWant::Decode(i < bytes.size() ? bytes[i] : '\0');
      if (w.wanted) all.any[i] = true;
      if (!w.whole || w.part) all.whole_by_all[i] = false;
      if (!w.whole_on_device) all.whole_on_device_everywhere[i] = false;
      if (w.whole) all.whole_by_some[i] = true;
      if (w.compared) all.compared_anywhere = true;
    }
  }
  return all;
}

}  // namespace shardckpt
