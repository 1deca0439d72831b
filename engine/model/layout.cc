#include "shardckpt/engine/model/layout.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  return strides;
}

}  // namespace

Layout Layout::Box(Dims offsets, Dims sizes) {
  Layout layout;
  layout.kind = LayoutKind::kBox;
  layout.offsets = std::move(offsets);
  layout.sizes = std::move(sizes);
  return layout;
}

Layout Layout::FlatRange(int64_t begin, int64_t end) {
  Layout layout;
  layout.kind = LayoutKind::kFlatRange;
  layout.begin = begin;
  layout.end = end;
  return layout;
}

bool Layout::operator==(const Layout& other) const {
  if (kind != other.kind) return false;
  switch (kind) {
    case LayoutKind::kWhole: return true;
    case LayoutKind::kBox: return offsets == other.offsets && sizes == other.sizes;
    case LayoutKind::kFlatRange: return begin == other.begin && end == other.end;
  }
  return false;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::string Layout::ToString() const {
  switch (kind) {
    case LayoutKind::kWhole: return "replicated";
    case LayoutKind::kBox: return "box(offsets=" + ShapeString(offsets) + ", sizes=" + ShapeString(sizes) + ")";
    case LayoutKind::kFlatRange:
      return "flat[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  }
  return "?";
}

Result<int64_t> NumElements(const Shape& shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return InvalidArgument("shape " + ShapeString(shape) + " has more than " +
                           std::to_string(kMaxDims) + " dims");
  }
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return InvalidArgument("shape " + ShapeString(shape) + " has a negative dim");
    if (__builtin_mul_overflow(count, dim, &count) || count > kMaxBytes) {
      return InvalidArgument("shape " + ShapeString(shape) + " is too large");
    }
  }
  return count;
}

Result<int64_t> NumBytes(const Shape& shape, size_t element_size) {
  SC_ASSIGN_OR_RETURN(int64_t count, NumElements(shape));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<int64_t>(element_size), &bytes) || bytes > kMaxBytes) {
    return InvalidArgument("shape " + ShapeString(shape) + " is too large in bytes");
  }
  return bytes;
}

Result<int64_t> ValidateLayout(const Layout& layout, const Shape& global) {
  SC_ASSIGN_OR_RETURN(int64_t numel, NumElements(global));
  return ValidateLayout(layout, global, numel);
}

Result<int64_t> ValidateLayout(const Layout& layout, const Shape& global, int64_t numel) {
  switch (layout.kind) {
    case LayoutKind::kWhole: return numel;
    case LayoutKind::kFlatRange:
      if (layout.begin < 0 || layout.end < layout.begin || layout.end > numel) {
        return InvalidArgument(layout.ToString() + " is outside a tensor of " +
                               std::to_string(numel) + " elements");
      }
      return layout.end - layout.begin;
    case LayoutKind::kBox: {
      if (layout.offsets.size() != global.size() || layout.sizes.size() != global.size()) {
        return InvalidArgument(layout.ToString() + " has a different rank from shape " +
                               ShapeString(global));
      }
      for (size_t d = 0; d < global.size(); ++d) {
        if (layout.offsets[d] < 0 || layout.sizes[d] < 0 ||
            layout.offsets[d] > global[d] - layout.sizes[d]) {
          return InvalidArgument(layout.ToString() + " is outside shape " + ShapeString(global));
        }
      }
      // Each size is within its dim of `global`, whose product was checked above: no overflow,
      // and no Shape built per chunk (this runs for every chunk of a manifest).
      int64_t count = 1;
      for (int64_t size : layout.sizes) count *= size;
      return count;
    }
  }
  return InvalidArgument("unknown layout kind");
}

Shape LocalShape(const Layout& layout, const Shape& global) {
  switch (layout.kind) {
    case LayoutKind::kWhole: return global;
    case LayoutKind::kBox: return layout.sizes;
    case LayoutKind::kFlatRange: return {layout.end - layout.begin};
  }
  return global;
}

int64_t ContiguousStart(const Layout& layout, const Shape& global) {
  if (layout.kind == LayoutKind::kWhole) return 0;
  if (layout.kind == LayoutKind::kFlatRange) return layout.begin;
  if (global.empty() || layout.offsets.size() != global.size() || layout.sizes.size() != global.size()) return -1;
  int64_t row = 1;
  for (size_t d = 1; d < global.size(); ++d) {
    if (layout.offsets[d] != 0 || layout.sizes[d] != global[d]) return -1;
    row *= global[d];
  }
  return layout.offsets[0] * row;
}

bool NormalizesToWhole(const Layout& layout, const Shape& global) {
  if (layout.kind == LayoutKind::kBox) return layout.sizes == global;
  if (layout.kind == LayoutKind::kFlatRange && layout.begin == 0) {
    Result<int64_t> numel = NumElements(global);
    return numel.ok() && layout.end == *numel && numel.value() > 0;
  }
  return false;
}

Layout Normalize(const Layout& layout, const Shape& global) {
  return NormalizesToWhole(layout, global) ? Layout::Whole() : layout;
}

namespace {

Status CheckParts(int parts, int index) {
  if (parts < 1) return InvalidArgument("parts is " + std::to_string(parts) + "; it must be at least 1");
  if (index < 0 || index >= parts) {
    return InvalidArgument("index " + std::to_string(index) + " is outside [0, " + std::to_string(parts) + ")");
  }
  return Status::Ok();
}

// The unchecked wrappers cannot return an error: they log it and hand back a layout that
// ValidateLayout (and so AddTensor) refuses, rather than dividing by zero or reading past a shape.
// A layout no valid piece has: a flat range starting at -1, ending at -2 - its number. The
// reasons of this thread's latest refusals, by number (AddTensor receives the layout right
// after, on the same thread, in the code these helpers are for).
constexpr int64_t kRefusedBegin = -1;
constexpr size_t kKeptReasons = 256;
thread_local std::map<int64_t, std::string> refused_reasons;
thread_local int64_t refusals = 0;

Layout OrInvalid(Result<Layout> layout, const char* what) {
  if (layout.ok()) return std::move(layout).value();
  const int64_t number = refusals++;
  std::string& reason = refused_reasons[number] = std::string(what) + ": " + layout.status().message();
  SC_LOG(kError) << reason;
  if (refused_reasons.size() > kKeptReasons) refused_reasons.erase(refused_reasons.begin());
  return Layout::FlatRange(kRefusedBegin, -2 - number);
}

}  // namespace

Result<Layout> CheckedChunkLayout(const Shape& global, int dim, int parts, int index) {
  SC_RETURN_IF_ERROR(NumElements(global).status());
  if (dim < 0 || static_cast<size_t>(dim) >= global.size()) {
    return InvalidArgument("chunk dim " + std::to_string(dim) + " is outside shape " + ShapeString(global));
  }
  // The context is built only on failure: this runs once per rank and entry in a reshard.
  if (Status parts_ok = CheckParts(parts, index); !parts_ok.ok()) {
    return parts_ok.WithContext("chunk of shape " + ShapeString(global));
  }
  Dims offsets, sizes = global;
  offsets.resize(global.size(), 0);
  int64_t extent = global[dim];
  int64_t step = (extent + parts - 1) / parts;
  int64_t begin = std::min<int64_t>(extent, step * index);
  int64_t end = std::min<int64_t>(extent, begin + step);
  offsets[dim] = begin;
  sizes[dim] = end - begin;
  return Layout::Box(std::move(offsets), std::move(sizes));
}

Result<Layout> CheckedFlatShardLayout(const Shape& global, int parts, int index) {
  SC_ASSIGN_OR_RETURN(int64_t numel, NumElements(global));
  if (Status parts_ok = CheckParts(parts, index); !parts_ok.ok()) {
    return parts_ok.WithContext("flat shard of shape " + ShapeString(global));
  }
  int64_t step = (numel + parts - 1) / parts;
  int64_t begin = std::min<int64_t>(numel, step * index);
  return Layout::FlatRange(begin, std::min<int64_t>(numel, begin + step));
}

Result<std::vector<RunPiece>> RunPieces(const Shape& global, int parts, bool along_dim0) {
  SC_ASSIGN_OR_RETURN(const int64_t numel, NumElements(global));
  if (Status parts_ok = CheckParts(parts, 0); !parts_ok.ok()) {
    return parts_ok.WithContext("pieces of shape " + ShapeString(global));
  }
  std::vector<RunPiece> pieces;
  if (along_dim0 && global.empty()) {  // a 0-d tensor cannot be cut: rank 0 holds it
    pieces.push_back(RunPiece{Layout::Whole(), 0, 1});
    return pieces;
  }
  // Runs of rows (dim 0) or of elements (flat), `unit` elements each.
  const int64_t extent = along_dim0 ? global[0] : numel;
  const int64_t unit = along_dim0 && extent > 0 ? numel / extent : 1;
  const int64_t step = (extent + parts - 1) / parts;
  pieces.reserve(static_cast<size_t>(std::min<int64_t>(parts, std::max<int64_t>(extent, 1))));
  for (int i = 0; i < parts; ++i) {
    const int64_t begin = std::min<int64_t>(extent, step * i);
    const int64_t end = std::min<int64_t>(extent, begin + step);
    if ((end - begin) * unit == 0 && i > 0) break;
    // Filled in place: a Layout is 100 bytes, and moving one in was half this loop's work.
    RunPiece& piece = pieces.emplace_back();
    Layout& layout = piece.layout;
    if (along_dim0) {
      layout.kind = LayoutKind::kBox;
      layout.sizes = global;
      layout.sizes[0] = end - begin;
      layout.offsets.resize(global.size(), 0);
      layout.offsets[0] = begin;
    } else {
      layout.kind = LayoutKind::kFlatRange;
      layout.begin = begin;
      layout.end = end;
    }
    piece.first = begin * unit;
    piece.count = (end - begin) * unit;
  }
  return pieces;
}

std::vector<RunPiece> SplitRunPiece(const RunPiece& piece, size_t element_size, uint64_t max_bytes) {
  const uint64_t bytes = static_cast<uint64_t>(piece.count) * element_size;
  const bool rows = piece.layout.kind == LayoutKind::kBox && !piece.layout.sizes.empty() && piece.layout.sizes[0] > 0;
  if (bytes <= max_bytes || element_size == 0 || (piece.layout.kind != LayoutKind::kFlatRange && !rows)) return {piece};
  // Elements in one unit of the cut: an element of a flat range, a row of a box of rows.
  const int64_t unit = rows ? piece.count / piece.layout.sizes[0] : 1;
  const int64_t units = rows ? piece.layout.sizes[0] : piece.count;
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(max_bytes / (static_cast<uint64_t>(unit) * element_size)));
  std::vector<RunPiece> out;
  for (int64_t at = 0; at < units; at += per) {
    const int64_t n = std::min(per, units - at);
    RunPiece& part = out.emplace_back(RunPiece{piece.layout, piece.first + at * unit, n * unit});
    if (rows) {
      part.layout.offsets[0] = piece.layout.offsets[0] + at;
      part.layout.sizes[0] = n;
    } else {
      part.layout.begin = piece.layout.begin + at;
      part.layout.end = part.layout.begin + n;
    }
  }
  return out;
}

Layout ChunkLayout(const Shape& global, int dim, int parts, int index) {
  return OrInvalid(CheckedChunkLayout(global, dim, parts, index), "ChunkLayout");
}

Layout FlatShardLayout(const Shape& global, int parts, int index) {
  return OrInvalid(CheckedFlatShardLayout(global, parts, index), "FlatShardLayout");
}

bool IsRefusedLayout(const Layout& layout) {
  return layout.kind == LayoutKind::kFlatRange && layout.begin == kRefusedBegin && layout.end <= -2;
}

std::string RefusedLayoutReason(const Layout& layout) {
  auto it = refused_reasons.find(-2 - layout.end);
  return it != refused_reasons.end() ? it->second
                                     : "a ChunkLayout or FlatShardLayout with bad arguments (the reason was logged)";
}

bool HoldsNoElements(const Layout& layout, const Shape& global) {
  switch (layout.kind) {
    case LayoutKind::kWhole: return std::find(global.begin(), global.end(), 0) != global.end();
    case LayoutKind::kBox: return std::find(layout.sizes.begin(), layout.sizes.end(), 0) != layout.sizes.end();
    case LayoutKind::kFlatRange: return layout.end <= layout.begin;
  }
  return false;
}

std::vector<Region> LayoutRegions(const Layout& layout, const Shape& global) {
  const size_t n = global.size();
  std::vector<Region> regions;
  if (HoldsNoElements(layout, global)) return regions;
  if (layout.kind != LayoutKind::kFlatRange) {
    Region region;
    if (layout.kind == LayoutKind::kBox) {
      region.lo.assign(layout.offsets.begin(), layout.offsets.end());
      region.size.assign(layout.sizes.begin(), layout.sizes.end());
    } else {
      region.lo.assign(n, 0);
      region.size = global;
    }
    region.stride = RowMajorStrides(region.size);
    for (size_t d = 0; d < n; ++d) region.base -= region.lo[d] * region.stride[d];
    regions.push_back(std::move(region));
    return regions;
  }
  // blocks[j] = elements in one step of dim j-1, i.e. product of global[j..n); blocks[n] = 1.
  std::vector<int64_t> blocks(n + 1, 1);
  for (size_t j = n; j-- > 0;) blocks[j] = blocks[j + 1] * global[j];
  const std::vector<int64_t> strides = RowMajorStrides(global);
  int64_t b = layout.begin;
  const int64_t e = layout.end;
  auto emit = [&](std::vector<int64_t> lo, std::vector<int64_t> size) {
    Region region{std::move(lo), std::move(size), -layout.begin, strides};
    regions.push_back(std::move(region));
  };
  if (n == 0) {
    if (e > b) emit({}, {});
    return regions;
  }
  while (b < e) {
    // The largest aligned block that starts at b and fits before e: a run of `count` steps of
    // dim j-1, each spanning dims j.. fully.
    size_t j = 1;
    while (j < n && !(b % blocks[j] == 0 && b + blocks[j] <= e)) ++j;
    int64_t room_in_parent = (blocks[j - 1] - b % blocks[j - 1]) / blocks[j];
    int64_t count = std::min((e - b) / blocks[j], room_in_parent);
    std::vector<int64_t> lo(n), size(n);
    int64_t rest = b;
    for (size_t d = 0; d < n; ++d) {
      lo[d] = rest / strides[d];
      rest %= strides[d];
    }
    for (size_t d = 0; d < n; ++d) {
      if (d + 1 < j) size[d] = 1;
      else if (d + 1 == j) size[d] = count;
      else size[d] = global[d];
    }
    emit(std::move(lo), std::move(size));
    b += count * blocks[j];
  }
  return regions;
}

bool RegionsIntersect(const Region& a, const Region& b) {
  for (size_t d = 0; d < a.lo.size(); ++d) {
    if (std::max(a.lo[d], b.lo[d]) >= std::min(a.lo[d] + a.size[d], b.lo[d] + b.size[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace shardckpt
