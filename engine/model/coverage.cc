#include "shardckpt/engine/model/coverage.h"

#include "shardckpt/engine/model/region_index.h"

#include <algorithm>
#include <optional>

namespace shardckpt {

namespace {

// Flat ranges only (FSDP, ZeRO): sorted by begin they must tile [0, numel) end to end.
// `pieces[i]` is piece i's layout, `owners[i]` its name for messages.
template <class Pieces, class Owners>
CoverResult CheckFlatCover(const std::string& entry, const Shape& global, int64_t numel, const Pieces& pieces,
                      const Owners& owners) {
  std::vector<size_t> order;
  order.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    Result<int64_t> count = ValidateLayout(pieces[i], global);
    if (!count.ok()) return {count.status().WithContext("entry '" + entry + "' from " + owners[i]), CoverProblem::kBadPiece};
    if (*count > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pieces[a].begin < pieces[b].begin; });
  int64_t expected = 0, gap_end = numel;
  for (size_t k = 0; k < order.size(); ++k) {
    const Layout& p = pieces[order[k]];
    if (p.begin < expected) {
      return {InvalidArgument("entry '" + entry + "': " + p.ToString() + " from " + owners[order[k]] + " overlaps " +
                              pieces[order[k - 1]].ToString() + " from " + owners[order[k - 1]]),
              CoverProblem::kOverlap};
    }
    if (p.begin > expected) {  // a gap: reported with the count below
      gap_end = p.begin;
      break;
    }
    expected = p.end;
  }
  if (expected != numel) {
    int64_t covered = 0;
    for (size_t i : order) covered += pieces[i].end - pieces[i].begin;
    return {InvalidArgument("entry '" + entry + "' of shape " + ShapeString(global) + ": pieces cover " +
                            std::to_string(covered) + " of " + std::to_string(numel) + " elements (missing pieces): flat[" +
                            std::to_string(expected) + ", " + std::to_string(gap_end) + ") is in none"),
            CoverProblem::kMissing};
  }
  return {};
}

// The first element (row-major) that no region holds, or nullopt when the search would be too
// long for an error message. Each coordinate of that element is 0 or the end of some region in
// that dim (the element before it in that dim is held by a region that stops there), so only
// those coordinates are tried, in row-major order.
std::optional<std::vector<int64_t>> FirstElementInNoRegion(const Shape& global, const std::vector<Region>& regions,
                                                           const RegionIndex& index) {
  constexpr uint64_t kMaxProbes = 1u << 16;  // an error message; a hostile manifest must not make it slow
  const size_t dims = global.size();
  if (dims == 0) return regions.empty() ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{}) : std::nullopt;
  std::vector<std::vector<int64_t>> candidates(dims);
  uint64_t probes = 1;
  for (size_t d = 0; d < dims; ++d) {
    std::vector<int64_t>& c = candidates[d];
    c.push_back(0);
    for (const Region& r : regions) {
      if (r.lo[d] + r.size[d] < global[d]) c.push_back(r.lo[d] + r.size[d]);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    probes *= c.size();
    if (probes > kMaxProbes) return std::nullopt;
  }
  std::vector<size_t> at(dims, 0);
  Region probe;
  probe.lo.assign(dims, 0);
  probe.size.assign(dims, 1);
  while (true) {
    for (size_t d = 0; d < dims; ++d) probe.lo[d] = candidates[d][at[d]];
    bool held = false;
    index.ForEachIntersecting(probe, [&](size_t) { held = true; });
    if (!held) return probe.lo;
    size_t d = dims;
    while (true) {  // the next candidate in row-major order: the last dim moves fastest
      --d;
      if (++at[d] < candidates[d].size()) break;
      at[d] = 0;
      if (d == 0) return std::nullopt;
    }
  }
}

std::string IndexText(const std::vector<int64_t>& index) {
  std::string out = "[";
  for (size_t d = 0; d < index.size(); ++d) out += (d ? ", " : "") + std::to_string(index[d]);
  return out + "]";
}

template <class Pieces, class Owners>
CoverResult CheckCover(const std::string& entry, const Shape& global, const Pieces& pieces, const Owners& owners) {
  Result<int64_t> total = NumElements(global);
  if (!total.ok()) return {total.status(), CoverProblem::kBadPiece};
  const int64_t numel = *total;
  if (pieces.size() == 1 && pieces[0].kind == LayoutKind::kWhole) return {};  // replicated state
  bool all_flat = true;
  for (size_t i = 0; i < pieces.size() && all_flat; ++i) all_flat = pieces[i].kind == LayoutKind::kFlatRange;
  if (all_flat) return CheckFlatCover(entry, global, numel, pieces, owners);
  std::vector<Region> regions;
  std::vector<size_t> region_piece;
  int64_t covered = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Result<int64_t> count = ValidateLayout(pieces[i], global);
    if (!count.ok()) return {count.status().WithContext("entry '" + entry + "' from " + owners[i]), CoverProblem::kBadPiece};
    covered += *count;
    for (Region& r : LayoutRegions(pieces[i], global)) {
      regions.push_back(std::move(r));
      region_piece.push_back(i);
    }
  }
  RegionIndex index(&regions);
  // Real partitions (rows, columns, 2-D grids, 3-D ones of 16 a side) take at most tens of
  // tests per region; a checkpoint's pieces that take more than this are refused rather than
  // checked for hours (seconds of work at this bound).
  const uint64_t max_tests = std::max<uint64_t>(uint64_t{1} << 26, 64 * static_cast<uint64_t>(regions.size()));
  for (size_t i = 0; i < regions.size(); ++i) {
    if (index.tests() > max_tests) {
      return {InvalidArgument("entry '" + entry + "': its " + std::to_string(pieces.size()) + " pieces (" +
                              std::to_string(regions.size()) + " boxes) take more than " + std::to_string(max_tests) +
                              " box tests to check for overlaps; refused (not a layout shardckpt or DCP writes)"),
              CoverProblem::kBadPiece};
    }
    Status overlap;
    index.ForEachIntersecting(regions[i], [&](size_t j) {
      size_t a = region_piece[i], b = region_piece[j];
      if (a == b || !overlap.ok()) return;
      overlap = InvalidArgument("entry '" + entry + "': " + pieces[a].ToString() + " from " +
                                owners[a] + " overlaps " + pieces[b].ToString() + " from " +
                                owners[b]);
    });
    if (!overlap.ok()) return {overlap, CoverProblem::kOverlap};
  }
  if (covered != numel) {
    std::optional<std::vector<int64_t>> first = FirstElementInNoRegion(global, regions, index);
    return {InvalidArgument("entry '" + entry + "' of shape " + ShapeString(global) + ": pieces cover " +
                            std::to_string(covered) + " of " + std::to_string(numel) + " elements (missing pieces)" +
                            (first ? ": element " + IndexText(*first) + " is in none" : "")),
            CoverProblem::kMissing};
  }
  return {};
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
  return CheckCover(entry, global, pieces, owners).status;
}

CoverResult CheckExactCover(const std::string& entry, const Shape& global, const std::vector<const Layout*>& pieces,
                            const std::function<std::string(size_t)>& owner) {
  return CheckCover(entry, global, LayoutPointers{pieces}, OwnerNames{owner});
}

namespace {

// Appends the runs [begin, end) of the row-major index space that `layout` holds; false once
// `*budget` runs are spent.
bool AppendRuns(const Layout& layout, const Shape& global, uint64_t* budget,
                std::vector<std::pair<int64_t, int64_t>>* runs) {
  auto add = [&](int64_t begin, int64_t end) {
    if (end <= begin) return true;
    if (*budget == 0) return false;
    --*budget;
    runs->emplace_back(begin, end);
    return true;
  };
  if (layout.kind == LayoutKind::kWhole) return add(0, NumElements(global).value());
  if (layout.kind == LayoutKind::kFlatRange) return add(layout.begin, layout.end);
  const size_t dims = global.size();
  if (layout.offsets.size() != dims || layout.sizes.size() != dims) return false;  // not of this shape: no answer
  for (size_t d = 0; d < dims; ++d) {
    if (layout.sizes[d] == 0) return true;
  }
  // The dims after `cut` are whole: each run is sizes[cut] of those blocks, one run per index of
  // the dims before `cut`.
  size_t cut = dims;
  int64_t block = 1;
  while (cut > 0 && layout.offsets[cut - 1] == 0 && layout.sizes[cut - 1] == global[cut - 1]) block *= global[--cut];
  if (cut == 0) return add(0, block);
  --cut;
  const int64_t run = layout.sizes[cut] * block;
  std::vector<int64_t> at(cut, 0);  // odometer over dims [0, cut)
  while (true) {
    int64_t start = 0;
    for (size_t d = 0; d < cut; ++d) start = start * global[d] + layout.offsets[d] + at[d];
    start = (start * global[cut] + layout.offsets[cut]) * block;
    if (!add(start, start + run)) return false;
    size_t d = cut;
    while (d > 0 && ++at[d - 1] == layout.sizes[d - 1]) at[--d] = 0;
    if (d == 0) return true;
  }
}

}  // namespace

std::optional<bool> PartsCoverWhole(const std::vector<Layout>& parts, const Shape& global, uint64_t max_runs) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  uint64_t budget = max_runs;
  for (const Layout& part : parts) {
    if (!AppendRuns(part, global, &budget, &runs)) return std::nullopt;
  }
  std::sort(runs.begin(), runs.end());
  int64_t covered = 0;  // [0, covered) is held
  for (const auto& [begin, end] : runs) {
    if (begin > covered) return false;
    covered = std::max(covered, end);
  }
  return covered >= NumElements(global).value();
}

}  // namespace shardckpt
