#include "shardckpt/engine/model/coverage.h"

#include "shardckpt/engine/model/region_index.h"

#include <algorithm>

namespace shardckpt {

namespace {

// Flat ranges only (FSDP, ZeRO): sorted by begin they must tile [0, numel) end to end.
// `pieces[i]` is piece i's layout, `owners[i]` its name for messages.
template <class Pieces, class Owners>
Status CheckFlatCover(const std::string& entry, const Shape& global, int64_t numel, const Pieces& pieces,
                      const Owners& owners) {
  std::vector<size_t> order;
  order.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    Result<int64_t> count = ValidateLayout(pieces[i], global);
    if (!count.ok()) return count.status().WithContext("entry '" + entry + "' from " + owners[i]);
    if (*count > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pieces[a].begin < pieces[b].begin; });
  int64_t expected = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const Layout& p = pieces[order[k]];
    if (p.begin < expected) {
      return InvalidArgument("entry '" + entry + "': " + p.ToString() + " from " + owners[order[k]] + " overlaps " +
                             pieces[order[k - 1]].ToString() + " from " + owners[order[k - 1]]);
    }
    if (p.begin > expected) break;  // a gap: reported with the count below
    expected = p.end;
  }
  if (expected != numel) {
    int64_t covered = 0;
    for (size_t i : order) covered += pieces[i].end - pieces[i].begin;
    return InvalidArgument("entry '" + entry + "' of shape " + ShapeString(global) + ": pieces cover " +
                           std::to_string(covered) + " of " + std::to_string(numel) + " elements (missing pieces)");
  }
  return Status::Ok();
}

template <class Pieces, class Owners>
Status CheckCover(const std::string& entry, const Shape& global, const Pieces& pieces, const Owners& owners) {
  SC_ASSIGN_OR_RETURN(int64_t numel, NumElements(global));
  if (pieces.size() == 1 && pieces[0].kind == LayoutKind::kWhole) return Status::Ok();  // replicated state
  bool all_flat = true;
  for (size_t i = 0; i < pieces.size() && all_flat; ++i) all_flat = pieces[i].kind == LayoutKind::kFlatRange;
  if (all_flat) return CheckFlatCover(entry, global, numel, pieces, owners);
  std::vector<Region> regions;
  std::vector<size_t> region_piece;
  int64_t covered = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Result<int64_t> count = ValidateLayout(pieces[i], global);
    if (!count.ok()) return count.status().WithContext("entry '" + entry + "' from " + owners[i]);
    covered += *count;
    for (Region& r : LayoutRegions(pieces[i], global)) {
      regions.push_back(std::move(r));
      region_piece.push_back(i);
    }
  }
  RegionIndex index(&regions);
  for (size_t i = 0; i < regions.size(); ++i) {
    Status overlap;
    index.ForEachIntersecting(regions[i], [&](size_t j) {
      size_t a = region_piece[i], b = region_piece[j];
      if (a == b || !overlap.ok()) return;
      overlap = InvalidArgument("entry '" + entry + "': " + pieces[a].ToString() + " from " +
                                owners[a] + " overlaps " + pieces[b].ToString() + " from " +
                                owners[b]);
    });
    SC_RETURN_IF_ERROR(overlap);
  }
  if (covered != numel) {
    return InvalidArgument("entry '" + entry + "' of shape " + ShapeString(global) + ": pieces cover " +
                           std::to_string(covered) + " of " + std::to_string(numel) +
                           " elements (missing pieces)");
  }
  return Status::Ok();
}

// Views either kind of input as `pieces[i]` (a Layout) and `owners[i]` (a string).
struct LayoutPointers {
  const std::vector<const Layout*>& all;
  size_t size() const { return all.size(); }
  const Layout& operator[](size_t i) const { return *all[i]; }
};
struct OwnerNames {
  const std::function<std::string(size_t)>& name;
  std::string operator[](size_t i) const { return name(i); }
};

}  // namespace

Status CheckExactCover(const std::string& entry, const Shape& global,
                       const std::vector<Layout>& pieces, const std::vector<std::string>& owners) {
  return CheckCover(entry, global, pieces, owners);
}

Status CheckExactCover(const std::string& entry, const Shape& global, const std::vector<const Layout*>& pieces,
                       const std::function<std::string(size_t)>& owner) {
  return CheckCover(entry, global, LayoutPointers{pieces}, OwnerNames{owner});
}

}  // namespace shardckpt
