#include "shardckpt/engine/model/region_index.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

namespace shardckpt {

RegionIndex::RegionIndex(const std::vector<Region>* regions) : regions_(regions) {
  const size_t count = regions->size();
  if (count == 0) return;
  const size_t dims = (*regions)[0].lo.size();
  size_t best = 0;
  for (size_t d = 0; d < dims; ++d) {
    std::unordered_set<int64_t> starts;
    for (const Region& r : *regions) starts.insert(r.lo[d]);
    if (key_dim_ < 0 || starts.size() > best) {
      best = starts.size();
      key_dim_ = static_cast<int>(d);
    }
  }
  ids_.resize(count);
  std::iota(ids_.begin(), ids_.end(), 0);
  if (key_dim_ < 0) return;  // 0-d tensors: every region is a candidate
  auto start = [&](size_t id) { return (*regions)[id].lo[key_dim_]; };
  std::sort(ids_.begin(), ids_.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
  starts_.resize(count);
  ends_.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const Region& r = (*regions)[ids_[i]];
    starts_[i] = r.lo[key_dim_];
    ends_[i] = r.lo[key_dim_] + r.size[key_dim_];
  }
  max_end_.assign(4 * count, 0);
  Build(1, 0, count);
}

void RegionIndex::Build(size_t node, size_t lo, size_t hi) {
  if (hi - lo == 1) {
    max_end_[node] = ends_[lo];
    return;
  }
  size_t mid = (lo + hi) / 2;
  Build(2 * node, lo, mid);
  Build(2 * node + 1, mid, hi);
  max_end_[node] = std::max(max_end_[2 * node], max_end_[2 * node + 1]);
}

size_t RegionIndex::Limit(int64_t query_end) const {
  return static_cast<size_t>(std::lower_bound(starts_.begin(), starts_.end(), query_end) - starts_.begin());
}

}  // namespace shardckpt
