#include "shardckpt/engine/model/entry_alias.h"

#include <map>
#include <tuple>

namespace shardckpt {

std::vector<int64_t> EntryAliases(const Manifest& m) {
  std::vector<int64_t> alias(m.entries.size(), -1);
  // Keyed by the first chunk's place: entries that share it are compared in full.
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, std::vector<size_t>> by_first;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    if (e.chunks.empty()) continue;
    const ChunkRecord& c = e.chunks.front();
    std::vector<size_t>& seen = by_first[{c.file, c.offset, c.bytes}];
    for (size_t j : seen) {
      const EntryRecord& f = m.entries[j];
      if (f.dtype != e.dtype || f.shape != e.shape || f.chunks.size() != e.chunks.size()) continue;
      bool same = true;
      for (size_t k = 0; k < e.chunks.size() && same; ++k) {
        const ChunkRecord &a = e.chunks[k], &b = f.chunks[k];
        same = a.file == b.file && a.offset == b.offset && a.bytes == b.bytes && a.layout == b.layout;
      }
      if (same) {
        alias[i] = static_cast<int64_t>(j);
        break;
      }
    }
    if (alias[i] < 0) seen.push_back(i);
  }
  return alias;
}

}  // namespace shardckpt
