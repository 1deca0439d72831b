// Single-process, bounded-memory reads of a committed checkpoint: any part of any entry in any
// layout, through the planner and the verifying extent reader. The tools (consolidate, verify,
// reshard) stream through it one window at a time.
#pragma once

#include <memory>
#include <string>

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
  Status ReadPiece(size_t entry, const Layout& layout, void* out);
  Result<std::string> ReadBlob(const BlobRecord& blob);
  const ReadStats& stats() const { return stats_; }

 private:
  CheckpointReader() = default;
  Status Run(std::vector<CopyRequest> copies, const ReadTargets& targets);

  CheckpointHold hold_;  // retention leaves the folder while this reader is open
  std::string dir_;
  Manifest manifest_;
  std::unique_ptr<ChunkIndex> index_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BufferPool> pool_;
  ReadStats stats_;
};

}  // namespace shardckpt
