// Single-process, bounded-memory reads of a committed checkpoint: any part of any entry in any
// layout, through the planner and the verifying extent reader. The tools (consolidate, verify,
// reshard) stream through it one window at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/extent_reader.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/read_plan.h"

namespace shardckpt {

class CheckpointReader {
 public:
  // `path` is a checkpoint folder or a root (then `latest`).
  static Result<std::unique_ptr<CheckpointReader>> Open(const std::string& path, IoOptions io = {});
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  // Reads `layout` of entry `entry` into `out` (LocalShape(layout) bytes), verifying checksums.
  // Each part of a piece that lies within one window's size is served from a verified read-ahead
  // window of its file, one per file: tools walking many small entries in file order (reshard,
  // consolidate) read each block once instead of once per piece, which dominated with thousands of
  // packed chunks. Windows are kWindowBudget / files bytes (8 MiB to 64 KiB), so a piece cut
  // across every file of a wide checkpoint never evicts the window the next piece needs.
  Status ReadPiece(size_t entry, const Layout& layout, void* out);
  static constexpr uint64_t kWindowBudget = 64u << 20;
  static constexpr uint64_t kMaxWindow = 8u << 20, kMinWindow = 64u << 10;
  // A blob's bytes; in a DCP folder a byte item of plain values comes back as a value blob
  // (DcpByteItemValue), others as their torch.save bytes.
  Result<std::string> ReadBlob(const BlobRecord& blob);
  const ReadStats& stats() const { return stats_; }

 private:
  CheckpointReader() = default;
  Status Run(std::vector<CopyRequest> copies, const ReadTargets& targets);
  // Verified bytes [offset, offset + size) of one data file, in aligned memory allocated once
  // (window_bytes_), so each window is read straight into it.
  struct Window {
    uint64_t offset = 0;
    uint64_t size = 0;
    AlignedBuffer bytes;
  };
  // The window holding [begin, end) of `file`, read (and verified) if it does not yet; null when
  // the range is wider than a window or its blocks fail verification (the caller reads alone).
  Result<const Window*> WindowFor(uint32_t file, uint64_t begin, uint64_t end);

  CheckpointHold hold_;  // retention leaves the folder while this reader is open
  std::string dir_;
  bool dcp_ = false;  // a PyTorch DCP folder read in place
  Manifest manifest_;
  std::unique_ptr<ChunkIndex> index_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BufferPool> pool_;
  ReadStats stats_;
  std::vector<Window> windows_;  // by file
  std::vector<WantedPiece> wanted_;  // ReadPiece's scratch, kept across pieces
  std::vector<CopyRequest> piece_copies_, piece_direct_;
  uint64_t window_bytes_ = kMaxWindow;
};

}  // namespace shardckpt
