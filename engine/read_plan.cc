#include "engine/read_plan.h"

#include <algorithm>

#include "io/checksum.h"

namespace shardckpt {

const ChunkIndex::EntryIndex& ChunkIndex::For(size_t entry) {
  std::unique_ptr<EntryIndex>& slot = per_entry_[entry];
  if (!slot) {
    slot = std::make_unique<EntryIndex>();
    const EntryRecord& e = manifest_->entries[entry];
    for (size_t c = 0; c < e.chunks.size(); ++c) {
      for (Region& r : LayoutRegions(e.chunks[c].layout, e.shape)) {
        slot->regions.push_back(std::move(r));
        slot->chunk_of_region.push_back(c);
      }
    }
    slot->index = std::make_unique<RegionIndex>(&slot->regions);
  }
  return *slot;
}

void PlanPieceCopies(const Manifest& manifest, ChunkIndex& index,
                     const std::vector<WantedPiece>& wanted, std::vector<CopyRequest>* out) {
  for (const WantedPiece& w : wanted) {
    const EntryRecord& e = manifest.entries[w.entry];
    const uint64_t element = DTypeSize(e.dtype);
    const ChunkIndex::EntryIndex& saved = index.For(w.entry);
    for (const Region& want : LayoutRegions(w.layout, e.shape)) {
      saved.index->ForEachIntersecting(want, [&](size_t id) {
        const ChunkRecord& chunk = e.chunks[saved.chunk_of_region[id]];
        ForEachCopy(saved.regions[id], want, [&](int64_t src, int64_t dst, int64_t count) {
          out->push_back(CopyRequest{chunk.file, chunk.offset + static_cast<uint64_t>(src) * element,
                                     static_cast<uint64_t>(count) * element, w.target,
                                     static_cast<uint64_t>(dst) * element});
        });
      });
    }
  }
}

ReadPlan CoalesceReads(std::vector<CopyRequest> copies, const ReadPlanOptions& options) {
  ReadPlan plan;
  std::sort(copies.begin(), copies.end(), [](const CopyRequest& a, const CopyRequest& b) {
    return a.file != b.file ? a.file < b.file : a.file_offset < b.file_offset;
  });
  // Pass 1: merge into block-aligned ranges.
  std::vector<ReadExtent> merged;
  for (const CopyRequest& c : copies) {
    if (c.length == 0) continue;
    plan.bytes_wanted += c.length;
    uint64_t lo = AlignDown(c.file_offset, kBlockSize);
    uint64_t hi = AlignUp(c.file_offset + c.length, kBlockSize);
    if (merged.empty() || merged.back().file != c.file ||
        lo > merged.back().offset + merged.back().length + options.merge_gap) {
      merged.push_back(ReadExtent{c.file, lo, hi - lo, {}});
    } else {
      ReadExtent& last = merged.back();
      last.length = std::max(last.length, hi - last.offset);
    }
    ReadExtent& last = merged.back();
    last.copies.push_back(ScatterCopy{c.file_offset - last.offset, c.length, c.target, c.target_offset});
  }
  // Pass 2: cut each range into staging-buffer-sized extents, splitting copies at the cuts.
  const uint64_t max = std::max<uint64_t>(kBlockSize, AlignDown(options.max_extent, kBlockSize));
  for (ReadExtent& range : merged) {
    plan.bytes_read += range.length;
    if (range.length <= max) {
      plan.extents.push_back(std::move(range));
      continue;
    }
    size_t first = plan.extents.size();
    for (uint64_t at = 0; at < range.length; at += max) {
      plan.extents.push_back(ReadExtent{range.file, range.offset + at, std::min(max, range.length - at), {}});
    }
    for (const ScatterCopy& c : range.copies) {
      uint64_t begin = c.extent_offset, end = c.extent_offset + c.length;
      while (begin < end) {
        uint64_t piece = begin / max;
        uint64_t stop = std::min(end, (piece + 1) * max);
        plan.extents[first + piece].copies.push_back(
            ScatterCopy{begin - piece * max, stop - begin, c.target, c.target_offset + (begin - c.extent_offset)});
        begin = stop;
      }
    }
  }
  return plan;
}

}  // namespace shardckpt
