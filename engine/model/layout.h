// Which part of a global tensor a piece holds (docs/format.md, concepts), and the geometry the save
// validation and the load planner share.
//
// Every layout is reduced to a short list of Regions: an N-d box of global indices plus an affine
// map from a global index to an element offset inside the piece's own buffer. A Box is one region;
// a FlatRange [b, e) over the row-major flattened tensor is at most 2N-1 boxes (the partial rows
// at each end and the full blocks between), all sharing the map `linear(index) - b`. With that,
// every pairing (Box x Box, Box x FlatRange, FlatRange x FlatRange) is one box intersection.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dims.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

using Shape = std::vector<int64_t>;

enum class LayoutKind : uint8_t { kWhole, kBox, kFlatRange };

struct Layout {
  LayoutKind kind = LayoutKind::kWhole;
  Dims offsets;       // kBox (inline up to 4 dims: millions of chunks hold one each)
  Dims sizes;         // kBox
  int64_t begin = 0;  // kFlatRange, in elements
  int64_t end = 0;

  static Layout Whole() { return Layout{}; }
  static Layout Box(Dims offsets, Dims sizes);
  static Layout FlatRange(int64_t begin, int64_t end);

  bool operator==(const Layout& other) const;
  std::string ToString() const;
};

// Limits that keep every size computation far from int64 overflow.
inline constexpr int kMaxDims = 32;
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;  // 1 PiB per tensor

// Element count of `shape`, refusing negative dims and products that overflow.
Result<int64_t> NumElements(const Shape& shape);
// Bytes of `shape` at `element_size`, refused past kMaxBytes.
Result<int64_t> NumBytes(const Shape& shape, size_t element_size);
std::string ShapeString(const Shape& shape);

// Checks that `layout` lies inside `global`; returns its element count.
Result<int64_t> ValidateLayout(const Layout& layout, const Shape& global);
// The same, given NumElements(global) (checked by the caller): for the chunks of one entry, whose
// shape is checked once rather than once per chunk.
Result<int64_t> ValidateLayout(const Layout& layout, const Shape& global, int64_t numel);
// The local shape a piece's buffer has: the box sizes, [end-begin] for a flat range.
Shape LocalShape(const Layout& layout, const Shape& global);
// Turns a full-tensor Box into Whole so that equal pieces compare equal.
Layout Normalize(const Layout& layout, const Shape& global);
// Whether Normalize turns `layout` into Whole (a writer of many chunks normalizes in place: a
// copy per chunk was 6% of a reshard to 64 ranks).
bool NormalizesToWhole(const Layout& layout, const Shape& global);

// The first element of `layout` in the row-major `global` when the piece's elements are one
// run there (whole, a flat range, or a box cut along dim 0 only), else -1: such a piece is a
// single copy to or from the whole tensor, no regions needed.
int64_t ContiguousStart(const Layout& layout, const Shape& global);

// torch.chunk(global, parts, dim)[index] as a Box: chunks of ceil(n/parts); trailing ones may be
// smaller or empty. Refuses a dim outside the shape, parts < 1 and index outside [0, parts).
Result<Layout> CheckedChunkLayout(const Shape& global, int dim, int parts, int index);
// ZeRO/FSDP flat shard `index` of `parts`: ceil(numel/parts) elements each, the tail shorter or
// empty (padding is never stored). Refuses parts < 1 and index outside [0, parts).
Result<Layout> CheckedFlatShardLayout(const Shape& global, int parts, int index);
// The same for call sites that build a state inline: on bad arguments they log the reason and
// return a layout that AddTensor refuses with that reason.
Layout ChunkLayout(const Shape& global, int dim, int parts, int index);
Layout FlatShardLayout(const Shape& global, int parts, int index);
// Whether `layout` is what those return on bad arguments, and then why ("ChunkLayout: chunk dim
// 2 is outside shape [8, 8]"): each refused layout names its own reason, kept on the thread that
// made it for its 256 latest refusals.
bool IsRefusedLayout(const Layout& layout);
std::string RefusedLayoutReason(const Layout& layout);

// One piece of a tensor cut into ceil-sized runs (RunPieces): its layout and where its elements
// lie in the row-major whole tensor.
struct RunPiece {
  Layout layout;
  int64_t first = 0;  // element index in the whole tensor
  int64_t count = 0;  // elements
};
// Every piece of `global` cut into `parts` in order, as ChunkLayout(global, 0, parts, i)
// (`along_dim0`; a 0-d tensor is one Whole piece) or FlatShardLayout(global, parts, i) give them,
// up to the first empty one after piece 0 (all later ones are empty too). Piece 0 is always
// there, so an empty tensor still has one. The shape is checked once: a reshard of 20,000 tensors
// to 64 ranks cuts 630,000 pieces, and checking each one alone was a tenth of its time.
Result<std::vector<RunPiece>> RunPieces(const Shape& global, int parts, bool along_dim0);
// `piece` (of RunPieces) cut into runs of at most `max_bytes`, in order: a flat range into flat
// ranges, a run of rows into runs of whole rows (one row each when a row alone is larger). A
// piece within the bound, or a Whole one, comes back as it is.
std::vector<RunPiece> SplitRunPiece(const RunPiece& piece, size_t element_size, uint64_t max_bytes);

struct Region {
  std::vector<int64_t> lo;      // global index of the first element
  std::vector<int64_t> size;    // extent per dim
  int64_t base = 0;             // local offset = base + sum(index[d] * stride[d])
  std::vector<int64_t> stride;  // row-major strides of the piece's buffer (or the global tensor)
};

// Whether a (validated) layout of `global` holds no element: a zero extent in its box (or in the
// tensor, for a whole one), or an empty flat range. A rank's share of a tensor too small to cut
// for every rank is such a piece.
bool HoldsNoElements(const Layout& layout, const Shape& global);

// The regions of a (validated) layout. Empty pieces give none; a 0-d tensor has one region of
// zero dims.
std::vector<Region> LayoutRegions(const Layout& layout, const Shape& global);

// Calls copy(src_element, dst_element, count) for each maximal contiguous run in the
// intersection of two regions of the same tensor. Runs are merged across dims wherever both
// sides are contiguous, so a dim-0 split costs one call, not one per row.
// A template: it runs once per (chunk, wanted piece) pair, millions of times at scale.
template <typename F>
void ForEachCopy(const Region& src, const Region& dst, F&& copy);
bool RegionsIntersect(const Region& a, const Region& b);

template <typename F>
void ForEachCopy(const Region& src, const Region& dst, F&& copy) {
  // Stack arrays, no allocation.
  const size_t n = src.lo.size();
  int64_t lo[kMaxDims], size[kMaxDims], index[kMaxDims];
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(src.lo[d], dst.lo[d]);
    int64_t hi = std::min(src.lo[d] + src.size[d], dst.lo[d] + dst.size[d]);
    if (hi <= lo[d]) return;
    size[d] = hi - lo[d];
  }
  if (n == 0) {
    copy(src.base, dst.base, 1);
    return;
  }
  // Merge inner dims into one run while both sides stay contiguous.
  int64_t run = size[n - 1];
  size_t outer = n - 1;  // dims [0, outer) are iterated
  while (outer > 0 && src.stride[outer - 1] == run && dst.stride[outer - 1] == run) {
    run *= size[outer - 1];
    --outer;
  }
  // Offsets of the first run; each odometer step adds the strides of the dim that moved.
  int64_t s = src.base, t = dst.base;
  for (size_t d = 0; d < n; ++d) {
    s += lo[d] * src.stride[d];
    t += lo[d] * dst.stride[d];
    index[d] = lo[d];
  }
  while (true) {
    copy(s, t, run);
    size_t d = outer;
    while (true) {
      if (d == 0) return;
      --d;
      if (++index[d] < lo[d] + size[d]) {
        s += src.stride[d];
        t += dst.stride[d];
        break;
      }
      s -= (index[d] - 1 - lo[d]) * src.stride[d];
      t -= (index[d] - 1 - lo[d]) * dst.stride[d];
      index[d] = lo[d];
    }
  }
}

}  // namespace shardckpt
