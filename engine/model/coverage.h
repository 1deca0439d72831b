// Checks that the distinct pieces of one entry cover its global tensor exactly once: element
// counts add up to numel and no two pieces overlap. Replicas (equal layouts) must be removed
// first. Pure; shared by the save plan and by manifest validation.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

// `owners[i]` names piece i in messages ("rank 3", "chunk 7 in rank-00003.bin").
Status CheckExactCover(const std::string& entry, const Shape& global,
                       const std::vector<Layout>& pieces, const std::vector<std::string>& owners);

// What a failed check found, for a caller that adds its own hint to one kind of failure (the
// save plan explains missing pieces that may be a rank passing another rank's piece).
enum class CoverProblem { kNone, kBadPiece, kOverlap, kMissing };
struct CoverResult {
  Status status;
  CoverProblem problem = CoverProblem::kNone;
};

// The same without a copy of each layout nor a name made per piece: `owner(i)` is called only
// for a message (the save plan checks every entry of a state of thousands of small tensors).
CoverResult CheckExactCover(const std::string& entry, const Shape& global, const std::vector<const Layout*>& pieces,
                            const std::function<std::string(size_t)>& owner);

// Whether `parts` (layouts validated against `global`, overlaps allowed) together hold every
// element of it: each is cut into runs of the row-major index space, sorted and merged. Empty
// where that would take more than `max_runs` runs (a box cut along a late dim of a large tensor
// is one run per row), or where a box has another number of dims than `global`. For a load's
// parts that hold more elements than their tensor without holding each the same number of times:
// a count cannot tell a gap from uneven replicas.
std::optional<bool> PartsCoverWhole(const std::vector<Layout>& parts, const Shape& global, uint64_t max_runs);

}  // namespace shardckpt
