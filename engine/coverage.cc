#include "engine/coverage.h"

#include "engine/region_index.h"

namespace shardckpt {

Status CheckExactCover(const std::string& entry, const Shape& global,
                       const std::vector<Layout>& pieces, const std::vector<std::string>& owners) {
  SC_ASSIGN_OR_RETURN(int64_t numel, NumElements(global));
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

}  // namespace shardckpt
