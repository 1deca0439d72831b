// The load planner (docs/architecture.md, load 3). Pure: manifest and wanted pieces in, per-file
// read extents out. No I/O, no allocation sized by anything but the plan itself.
//
// 1. PlanPieceCopies: each wanted piece is cut into regions (see layout.h); a per-entry
//    RegionIndex over the saved chunks' regions yields only the chunks that intersect it, and
//    ForEachCopy emits maximal contiguous runs: (file, file offset, length) -> (target, offset).
// 2. CoalesceReads: runs are widened to 4096-byte blocks (the O_DIRECT unit, and the checksum
//    unit), sorted per file, merged when the gap between them is at most `merge_gap`, and cut
//    into extents of at most `max_extent` bytes so each fits one staging buffer.
// Read amplification is bytes_read / bytes_wanted; only block alignment and merged gaps add to it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/region_index.h"

namespace shardckpt {

struct CopyRequest {
  uint32_t file = 0;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint32_t target = 0;
  uint64_t target_offset = 0;
};

struct WantedPiece {
  size_t entry = 0;  // index into manifest.entries
  Layout layout;
  uint32_t target = 0;
};

// Chunk regions and their index for each entry, built on first use and kept, so planning for
// many ranks (or many pieces) reuses them.
class ChunkIndex {
 public:
  explicit ChunkIndex(const Manifest* manifest) : manifest_(manifest), per_entry_(manifest->entries.size()) {}
  struct EntryIndex {
    std::vector<Region> regions;
    std::vector<size_t> chunk_of_region;
    std::unique_ptr<RegionIndex> index;
  };
  const EntryIndex& For(size_t entry);

 private:
  const Manifest* manifest_;
  std::vector<std::unique_ptr<EntryIndex>> per_entry_;
};

void PlanPieceCopies(const Manifest& manifest, ChunkIndex& index,
                     const std::vector<WantedPiece>& wanted, std::vector<CopyRequest>* out);
// The same for one piece: a load of thousands of small pieces plans each as it goes, with no
// list of them (a copy of each layout, 2.4 MB of fresh memory at 20,000 pieces).
void PlanPieceCopy(const Manifest& manifest, ChunkIndex& index, size_t entry, const Layout& layout, uint32_t target,
                   std::vector<CopyRequest>* out);

struct ScatterCopy {
  uint64_t extent_offset = 0;
  uint64_t length = 0;
  uint32_t target = 0;
  uint64_t target_offset = 0;
};

struct ReadExtent {
  uint32_t file = 0;
  uint64_t offset = 0;  // 4096-aligned
  uint64_t length = 0;  // 4096-multiple
  size_t first_copy = 0;  // this extent's copies are plan.copies[first_copy, first_copy + copy_count)
  size_t copy_count = 0;
};

struct ReadPlanOptions {
  uint64_t merge_gap = 0;             // bytes of unneeded data worth reading to save an I/O
  uint64_t max_extent = 8ull << 20;  // must be a multiple of 4096
  // Used by Load only (not by CoalesceReads itself, nor by CheckpointReader): a load that verifies
  // checksums, into host memory only, from a memory-backed folder (tmpfs) cuts its extents at
  // most this long instead (rounded down to a multiple of 4096; 0: as max_extent). There a read
  // is a copy out of the page cache, and an extent that still fits in the CPU's cache is verified
  // there, not read back from memory: a replicated load from tmpfs ran 20% faster (64-256 KiB
  // measured best; benchmarks/README.md), 40% while another process used memory bandwidth. From
  // storage, larger reads keep the device busy; into device memory, each extent's copies are
  // waited for before its buffer is reused.
  uint64_t memory_backed_max_extent = 128u << 10;
};

// The options a load plans with: `asked`, its max_extent cut to memory_backed_max_extent when
// `cut_for_cache` (Load: the conditions above).
ReadPlanOptions PlanOptionsFor(const ReadPlanOptions& asked, bool cut_for_cache);

struct ReadPlan {
  std::vector<ReadExtent> extents;
  std::vector<ScatterCopy> copies;  // one flat array: no allocation per extent
  uint64_t bytes_wanted = 0;
  uint64_t bytes_read = 0;
};

ReadPlan CoalesceReads(std::vector<CopyRequest> copies, const ReadPlanOptions& options);

}  // namespace shardckpt
