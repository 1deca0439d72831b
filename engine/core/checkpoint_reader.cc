#include "shardckpt/engine/core/checkpoint_reader.h"

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"

namespace shardckpt {

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path, IoOptions io) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  SC_ASSIGN_OR_RETURN(r->hold_, HoldCheckpoint(path));
  r->dir_ = r->hold_.dir();
  SC_ASSIGN_OR_RETURN(r->manifest_, ReadManifest(r->dir_));
  r->index_ = std::make_unique<ChunkIndex>(&r->manifest_);
  ReadPlanOptions defaults;
  io.queue_depth = std::max<size_t>(io.queue_depth, 5);
  r->io_ = CreateIoEngine(io);
  SC_ASSIGN_OR_RETURN(r->pool_, BufferPool::Create(4, defaults.max_extent));
  return r;
}

Status CheckpointReader::Run(std::vector<CopyRequest> copies, const ReadTargets& targets) {
  ReadPlan plan = CoalesceReads(std::move(copies), ReadPlanOptions{});
  return ExecuteReadPlan(io_.get(), pool_.get(), dir_, manifest_, plan, targets, true, &stats_);
}

Status CheckpointReader::ReadPiece(size_t entry, const Layout& layout, void* out) {
  std::vector<CopyRequest> copies;
  PlanPieceCopies(manifest_, *index_, {WantedPiece{entry, layout, 0}}, &copies);
  return Run(std::move(copies), ReadTargets{{static_cast<unsigned char*>(out)}, {manifest_.entries[entry].name}});
}

Result<std::string> CheckpointReader::ReadBlob(const BlobRecord& blob) {
  std::string bytes(blob.bytes, '\0');
  SC_RETURN_IF_ERROR(Run({CopyRequest{blob.file, blob.offset, blob.bytes, 0, 0}},
                         ReadTargets{{reinterpret_cast<unsigned char*>(bytes.data())}, {"blob " + blob.name}}));
  return bytes;
}

}  // namespace shardckpt
