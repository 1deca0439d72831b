// Writes a committed checkpoint for N ranks from one process (import, reshard): one data file per
// rank, built piece by piece, then the same commit as a collective save. Pieces are copied into
// each rank's staging ring at once, so callers may reuse their buffers after Add returns.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/core/shard_writer.h"

namespace shardckpt {

class OfflineCheckpointWriter {
 public:
  static Result<std::unique_ptr<OfflineCheckpointWriter>> Begin(const std::string& root, int64_t step, int world);
  ~OfflineCheckpointWriter();

  Status AddPiece(int rank, const std::string& name, DType dtype, const Shape& shape, const Layout& layout,
                  const void* data, size_t bytes);
  Status AddBlob(int rank, const std::string& name, BlobScope scope, const std::string& bytes);
  // `name` is the entry `target` under a second name (tied weights): its manifest entry points at
  // the same chunks, so the bytes are stored once. `target` must be added (before Commit).
  Status AddAlias(const std::string& name, const std::string& target);
  // Returns the committed folder.
  Result<std::string> Commit(const CreationInfo& created, int keep_last = 0);

 private:
  OfflineCheckpointWriter() = default;
  Result<ShardFileWriter*> Writer(int rank);

  struct RankFile {
    std::unique_ptr<IoEngine> io;
    std::unique_ptr<BufferPool> pool;
    std::unique_ptr<ShardFileWriter> writer;
    std::vector<std::pair<std::string, ChunkRecord>> chunks;  // entry name, chunk (file set later)
    std::vector<BlobRecord> blobs;
  };
  std::unique_ptr<RootLock> lock_;
  std::string root_, temp_name_;
  int64_t step_ = 0;
  int world_ = 1;
  bool committed_ = false;
  std::map<int, RankFile> ranks_;
  std::map<std::string, EntryRecord> entries_;
  std::vector<std::string> order_;  // entry names as first added: the manifest keeps the caller's order
  std::vector<std::pair<std::string, std::string>> aliases_;  // name, target
};

}  // namespace shardckpt
