#include "shardckpt/engine/model/read_plan.h"

#include <algorithm>

#include "shardckpt/io/checksum.h"

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

namespace {

// Entries with at most this many chunks are first searched for a chunk of exactly the wanted
// layout (a load at the world size and layout of the save): one copy, and no region index built
// for the entry, which dominated planning with thousands of small entries.
constexpr size_t kExactMatchScan = 64;

const ChunkRecord* ExactChunk(const EntryRecord& e, const Layout& normal) {
  if (e.chunks.size() > kExactMatchScan) return nullptr;
  for (const ChunkRecord& chunk : e.chunks) {
    if (chunk.layout == normal) return &chunk;
  }
  return nullptr;
}

}  // namespace

void PlanPieceCopy(const Manifest& manifest, ChunkIndex& index, size_t entry, const Layout& layout, uint32_t target,
                   std::vector<CopyRequest>* out) {
  const EntryRecord& e = manifest.entries[entry];
  if (HoldsNoElements(layout, e.shape)) return;  // nothing to copy, no chunk to search
  const uint64_t element = DTypeSize(e.dtype);
  const Layout normal = Normalize(layout, e.shape);
  if (const ChunkRecord* chunk = ExactChunk(e, normal)) {
    out->push_back(CopyRequest{chunk->file, chunk->offset, chunk->bytes, target, 0});
    return;
  }
  auto emit = [&](const ChunkRecord& chunk, const Region& from, const Region& want) {
    ForEachCopy(from, want, [&](int64_t src, int64_t dst, int64_t count) {
      out->push_back(CopyRequest{chunk.file, chunk.offset + static_cast<uint64_t>(src) * element,
                                 static_cast<uint64_t>(count) * element, target, static_cast<uint64_t>(dst) * element});
    });
  };
  if (normal.kind == LayoutKind::kWhole) {
    // The whole tensor (consolidate, reshard): every chunk lies in it; no index needed, and no
    // regions unless a chunk is not one run (built then, once: most pieces need none).
    std::vector<Region> wants;
    for (const ChunkRecord& chunk : e.chunks) {
      if (const int64_t start = ContiguousStart(chunk.layout, e.shape); start >= 0) {  // one run: no regions
        out->push_back(CopyRequest{chunk.file, chunk.offset, chunk.bytes, target, static_cast<uint64_t>(start) * element});
        continue;
      }
      if (wants.empty()) wants = LayoutRegions(layout, e.shape);
      for (const Region& want : wants) {
        for (const Region& from : LayoutRegions(chunk.layout, e.shape)) emit(chunk, from, want);
      }
    }
    return;
  }
  const ChunkIndex::EntryIndex& saved = index.For(entry);
  for (const Region& want : LayoutRegions(layout, e.shape)) {
    saved.index->ForEachIntersecting(want, [&](size_t id) { emit(e.chunks[saved.chunk_of_region[id]], saved.regions[id], want); });
  }
}

void PlanPieceCopies(const Manifest& manifest, ChunkIndex& index,
                     const std::vector<WantedPiece>& wanted, std::vector<CopyRequest>* out) {
  for (const WantedPiece& w : wanted) PlanPieceCopy(manifest, index, w.entry, w.layout, w.target, out);
}

ReadPlan CoalesceReads(std::vector<CopyRequest> copies, const ReadPlanOptions& options) {
  ReadPlan plan;
  std::sort(copies.begin(), copies.end(), [](const CopyRequest& a, const CopyRequest& b) {
    return a.file != b.file ? a.file < b.file : a.file_offset < b.file_offset;
  });
  // Pass 1: merge into block-aligned ranges; a range's copies are consecutive in `merged_copies`.
  std::vector<ReadExtent> merged;
  std::vector<ScatterCopy> merged_copies;
  merged_copies.reserve(copies.size());
  for (const CopyRequest& c : copies) {
    if (c.length == 0) continue;
    plan.bytes_wanted += c.length;
    uint64_t lo = AlignDown(c.file_offset, kBlockSize);
    uint64_t hi = AlignUp(c.file_offset + c.length, kBlockSize);
    if (merged.empty() || merged.back().file != c.file ||
        lo > merged.back().offset + merged.back().length + options.merge_gap) {
      merged.push_back(ReadExtent{c.file, lo, hi - lo, merged_copies.size(), 0});
    } else {
      ReadExtent& last = merged.back();
      last.length = std::max(last.length, hi - last.offset);
    }
    ReadExtent& last = merged.back();
    merged_copies.push_back(ScatterCopy{c.file_offset - last.offset, c.length, c.target, c.target_offset});
    last.copy_count++;
  }
  // Pass 2: cut each range into staging-buffer-sized extents, splitting copies at the cuts.
  const uint64_t max = std::max<uint64_t>(kBlockSize, AlignDown(options.max_extent, kBlockSize));
  size_t extents = 0, cut_copies = 0;
  for (const ReadExtent& range : merged) {
    plan.bytes_read += range.length;
    extents += (range.length + max - 1) / max;
    if (range.length <= max) continue;
    const ScatterCopy* first = merged_copies.data() + range.first_copy;
    for (const ScatterCopy* c = first; c != first + range.copy_count; ++c) {
      cut_copies += (c->extent_offset + c->length - 1) / max - c->extent_offset / max;
    }
  }
  if (extents == merged.size()) {  // nothing to cut: the merged ranges are the plan
    plan.extents = std::move(merged);
    plan.copies = std::move(merged_copies);
    return plan;
  }
  plan.extents.reserve(extents);
  plan.copies.resize(merged_copies.size() + cut_copies);
  std::vector<size_t> fill;  // per cut extent of the range: where its next copy goes
  size_t next = 0;
  for (const ReadExtent& range : merged) {
    const ScatterCopy* first = merged_copies.data() + range.first_copy;
    if (range.length <= max) {
      plan.extents.push_back(ReadExtent{range.file, range.offset, range.length, next, range.copy_count});
      std::copy(first, first + range.copy_count, plan.copies.begin() + static_cast<std::ptrdiff_t>(next));
      next += range.copy_count;
      continue;
    }
    // Counted, then placed: a cut extent's copies are consecutive, in the order the range had them.
    const size_t parts = (range.length + max - 1) / max;
    const size_t first_extent = plan.extents.size();
    for (size_t k = 0; k < parts; ++k) {
      plan.extents.push_back(ReadExtent{range.file, range.offset + k * max, std::min(max, range.length - k * max), 0, 0});
    }
    for (const ScatterCopy* c = first; c != first + range.copy_count; ++c) {
      for (uint64_t k = c->extent_offset / max; k <= (c->extent_offset + c->length - 1) / max; ++k) {
        plan.extents[first_extent + k].copy_count++;
      }
    }
    fill.assign(parts, 0);
    for (size_t k = 0; k < parts; ++k) {
      plan.extents[first_extent + k].first_copy = next;
      fill[k] = next;
      next += plan.extents[first_extent + k].copy_count;
    }
    for (const ScatterCopy* c = first; c != first + range.copy_count; ++c) {
      uint64_t begin = c->extent_offset, end = c->extent_offset + c->length;
      while (begin < end) {
        const uint64_t k = begin / max;
        const uint64_t stop = std::min(end, (k + 1) * max);
        plan.copies[fill[k]++] =
            ScatterCopy{begin - k * max, stop - begin, c->target, c->target_offset + (begin - c->extent_offset)};
        begin = stop;
      }
    }
  }
  return plan;
}

ReadPlanOptions PlanOptionsFor(const ReadPlanOptions& asked, bool cut_for_cache) {
  ReadPlanOptions out = asked;
  if (cut_for_cache && asked.memory_backed_max_extent != 0) {
    out.max_extent = std::min(asked.max_extent, asked.memory_backed_max_extent);
  }
  return out;
}

}  // namespace shardckpt
