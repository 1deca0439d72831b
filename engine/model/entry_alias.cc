#include "shardckpt/engine/model/entry_alias.h"

#include <algorithm>
#include <tuple>

namespace shardckpt {

bool SameChunks(const EntryRecord& e, const EntryRecord& f) {
  if (f.dtype != e.dtype || f.shape != e.shape || f.chunks.size() != e.chunks.size()) return false;
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const ChunkRecord &a = e.chunks[k], &b = f.chunks[k];
    if (a.file != b.file || a.offset != b.offset || a.bytes != b.bytes || !(a.layout == b.layout)) return false;
  }
  return true;
}

std::vector<int64_t> EntryAliases(const Manifest& m) {
  std::vector<int64_t> alias(m.entries.size(), -1);
  // Entries in order of their first chunk's place (then of their index): only entries that share
  // it can be aliases, and they end up side by side. A sort, not a map of the places: this runs
  // for every entry of every consolidation and reshard, and a tree node per entry cost more than
  // the rest of the selection.
  struct Place {
    uint32_t file;
    uint64_t offset, bytes;
    size_t entry;
    auto key() const { return std::tie(file, offset, bytes, entry); }
  };
  std::vector<Place> places;
  places.reserve(m.entries.size());
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    if (e.chunks.empty()) continue;
    const ChunkRecord& c = e.chunks.front();
    places.push_back(Place{c.file, c.offset, c.bytes, i});
  }
  std::sort(places.begin(), places.end(), [](const Place& a, const Place& b) { return a.key() < b.key(); });
  std::vector<size_t> seen;  // the group's entries that are no alias, in index order
  for (size_t g = 0; g < places.size();) {
    size_t end = g + 1;
    while (end < places.size() && places[end].file == places[g].file && places[end].offset == places[g].offset &&
           places[end].bytes == places[g].bytes) {
      ++end;
    }
    seen.clear();
    for (size_t p = g; p < end; ++p) {
      const size_t i = places[p].entry;
      for (size_t j : seen) {
        if (SameChunks(m.entries[i], m.entries[j])) {
          alias[i] = static_cast<int64_t>(j);
          break;
        }
      }
      if (alias[i] < 0) seen.push_back(i);
    }
    g = end;
  }
  return alias;
}

}  // namespace shardckpt
