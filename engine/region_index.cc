#include "engine/region_index.h"

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

void RegionIndex::Visit(size_t node, size_t lo, size_t hi, size_t limit, int64_t query_start,
                        const Region& query, const std::function<void(size_t)>& visit) const {
  if (lo >= limit || max_end_[node] <= query_start) return;
  if (hi - lo == 1) {
    if (RegionsIntersect((*regions_)[ids_[lo]], query)) visit(ids_[lo]);
    return;
  }
  size_t mid = (lo + hi) / 2;
  Visit(2 * node, lo, mid, limit, query_start, query, visit);
  Visit(2 * node + 1, mid, hi, limit, query_start, query, visit);
}

void RegionIndex::ForEachIntersecting(const Region& query,
                                      const std::function<void(size_t)>& visit) const {
  if (ids_.empty()) return;
  if (key_dim_ < 0) {
    for (size_t id : ids_) visit(id);
    return;
  }
  int64_t query_start = query.lo[key_dim_];
  int64_t query_end = query_start + query.size[key_dim_];
  // Intervals starting at or after query_end cannot overlap; among the rest, the tree prunes
  // every subtree whose intervals all end at or before query_start.
  size_t limit = static_cast<size_t>(
      std::lower_bound(starts_.begin(), starts_.end(), query_end) - starts_.begin());
  Visit(1, 0, ids_.size(), limit, query_start, query, visit);
}

}  // namespace shardckpt
