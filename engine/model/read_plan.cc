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

void PlanPieceCopies(const Manifest& manifest, ChunkIndex& index,
                     const std::vector<WantedPiece>& wanted, std::vector<CopyRequest>* out) {
  for (const WantedPiece& w : wanted) {
    const EntryRecord& e = manifest.entries[w.entry];
    const uint64_t element = DTypeSize(e.dtype);
    const Layout normal = Normalize(w.layout, e.shape);
    if (const ChunkRecord* chunk = ExactChunk(e, normal)) {
      out->push_back(CopyRequest{chunk->file, chunk->offset, chunk->bytes, w.target, 0});
      continue;
    }
    auto emit = [&](const ChunkRecord& chunk, const Region& from, const Region& want) {
      ForEachCopy(from, want, [&](int64_t src, int64_t dst, int64_t count) {
        out->push_back(CopyRequest{chunk.file, chunk.offset + static_cast<uint64_t>(src) * element,
                                   static_cast<uint64_t>(count) * element, w.target,
                                   static_cast<uint64_t>(dst) * element});
      });
    };
    if (normal.kind == LayoutKind::kWhole) {
      // The whole tensor (consolidate, reshard): every chunk lies in it; no index needed, and no
      // regions unless a chunk is not one run (built then, once: most pieces need none).
      std::vector<Region> wants;
      for (const ChunkRecord& chunk : e.chunks) {
        if (const int64_t start = ContiguousStart(chunk.layout, e.shape); start >= 0) {  // one run: no regions
          out->push_back(CopyRequest{chunk.file, chunk.offset, chunk.bytes, w.target, static_cast<uint64_t>(start) * element});
          continue;
        }
        if (wants.empty()) wants = LayoutRegions(w.layout, e.shape);
        for (const Region& want : wants) {
          for (const Region& from : LayoutRegions(chunk.layout, e.shape)) emit(chunk, from, want);
        }
      }
      continue;
    }
    const ChunkIndex::EntryIndex& saved = index.For(w.entry);
    for (const Region& want : LayoutRegions(w.layout, e.shape)) {
      saved.index->ForEachIntersecting(want, [&](size_t id) {
        emit(e.chunks[saved.chunk_of_region[id]], saved.regions[id], want);
      });
    }
  }
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
  plan.extents.reserve(merged.size());
  plan.copies.reserve(merged_copies.size());
  std::vector<std::vector<ScatterCopy>> pieces;
  for (const ReadExtent& range : merged) {
    plan.bytes_read += range.length;
    const ScatterCopy* first = merged_copies.data() + range.first_copy;
    if (range.length <= max) {
      plan.extents.push_back(ReadExtent{range.file, range.offset, range.length, plan.copies.size(), range.copy_count});
      plan.copies.insert(plan.copies.end(), first, first + range.copy_count);
      continue;
    }
    pieces.assign((range.length + max - 1) / max, {});
    for (const ScatterCopy* c = first; c != first + range.copy_count; ++c) {
      uint64_t begin = c->extent_offset, end = c->extent_offset + c->length;
      while (begin < end) {
        uint64_t piece = begin / max;
        uint64_t stop = std::min(end, (piece + 1) * max);
        pieces[piece].push_back(
            ScatterCopy{begin - piece * max, stop - begin, c->target, c->target_offset + (begin - c->extent_offset)});
        begin = stop;
      }
    }
    for (size_t k = 0; k < pieces.size(); ++k) {
      plan.extents.push_back(ReadExtent{range.file, range.offset + k * max, std::min(max, range.length - k * max),
                                        plan.copies.size(), pieces[k].size()});
      plan.copies.insert(plan.copies.end(), pieces[k].begin(), pieces[k].end());
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
