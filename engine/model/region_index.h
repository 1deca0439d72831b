// Finds which regions of one tensor can intersect a query box without looking at all of them.
//
// The regions are keyed on one dim: the dim whose start offsets are most varied (dim 0 for row
// splits and flat shards, dim 1 for column splits, the finer axis of a 2-D grid). A static
// interval tree over [lo, lo + size) on that dim (intervals sorted by start, a segment tree of
// maximal ends) reports every candidate in O((k + 1) log n) for k candidates. Candidates still need
// the full box test; for real partitions (grids, flat shards) nearly all of them pass it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

class RegionIndex {
 public:
  // `regions` must outlive the index; ids are positions in it.
  explicit RegionIndex(const std::vector<Region>* regions);
  // Exact box tests made so far (candidates the key dim let through): a caller checking every
  // region against the others bounds its work by this (a grid whose key dim has few distinct
  // starts, a hostile manifest's million single-element boxes of a [2]*20 tensor, makes each
  // query test half of them).
  uint64_t tests() const { return tests_; }
  // Calls visit(id) for each region that intersects `query` (exact box test included).
  template <typename F>
  void ForEachIntersecting(const Region& query, F&& visit) const {
    if (ids_.empty()) return;
    if (key_dim_ < 0) {
      tests_ += ids_.size();
      for (size_t id : ids_) visit(id);
      return;
    }
    int64_t query_start = query.lo[key_dim_];
    // Intervals starting at or after the query's end cannot overlap; among the rest, the tree
    // prunes every subtree whose intervals all end at or before the query's start.
    size_t limit = Limit(query_start + query.size[key_dim_]);
    Visit(1, 0, ids_.size(), limit, query_start, query, visit);
  }

 private:
  void Build(size_t node, size_t lo, size_t hi);
  size_t Limit(int64_t query_end) const;
  template <typename F>
  void Visit(size_t node, size_t lo, size_t hi, size_t limit, int64_t query_start, const Region& query, F& visit) const {
    if (lo >= limit || max_end_[node] <= query_start) return;
    if (hi - lo == 1) {
      ++tests_;
      if (RegionsIntersect((*regions_)[ids_[lo]], query)) visit(ids_[lo]);
      return;
    }
    size_t mid = (lo + hi) / 2;
    Visit(2 * node, lo, mid, limit, query_start, query, visit);
    Visit(2 * node + 1, mid, hi, limit, query_start, query, visit);
  }

  const std::vector<Region>* regions_;
  int key_dim_ = -1;
  std::vector<int64_t> starts_;  // sorted
  std::vector<int64_t> ends_;
  std::vector<size_t> ids_;
  std::vector<int64_t> max_end_;  // segment tree over positions
  mutable uint64_t tests_ = 0;
};

}  // namespace shardckpt
