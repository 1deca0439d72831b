#include "shardckpt/engine/core/offline_writer.h"

#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {

Result<std::unique_ptr<OfflineCheckpointWriter>> OfflineCheckpointWriter::Begin(const std::string& root, int64_t step,
                                                                              int world) {
  if (world < 1) return InvalidArgument("world size must be at least 1");
  SC_RETURN_IF_ERROR(ValidateStep(step));
  std::unique_ptr<OfflineCheckpointWriter> w(new OfflineCheckpointWriter());
  SC_RETURN_IF_ERROR(MakeDirs(root));
  SC_ASSIGN_OR_RETURN(RootLock lock, RootLock::Acquire(root));
  w->lock_ = std::make_unique<RootLock>(std::move(lock));
  SC_RETURN_IF_ERROR(PrepareRoot(root, step));
  w->root_ = root;
  w->step_ = step;
  w->world_ = world;
  w->temp_name_ = TempDirName(step, RandomId());
  SC_RETURN_IF_ERROR(MakeDir(JoinPath(root, w->temp_name_)));
  return w;
}

OfflineCheckpointWriter::~OfflineCheckpointWriter() {
  if (!committed_ && !temp_name_.empty()) {
    ranks_.clear();
    RemoveCheckpointDir(root_, temp_name_).status().IgnoreError();  // an abandoned write leaves nothing
  }
}

Result<ShardFileWriter*> OfflineCheckpointWriter::Writer(int rank) {
  if (rank < 0 || rank >= world_) return InvalidArgument("rank " + std::to_string(rank) + " outside the world");
  RankFile& f = ranks_[rank];
  if (!f.writer) {
    // Many files are open at once: small rings each.
    SC_ASSIGN_OR_RETURN(f.pool, BufferPool::Create(2, 1u << 20));
    IoOptions io;
    io.queue_depth = 3;
    f.io = CreateIoEngine(io);
    f.writer = std::make_unique<ShardFileWriter>(f.io.get(), f.pool.get(), /*always_stage=*/true);
    SC_RETURN_IF_ERROR(f.writer->Open(JoinPath(root_, temp_name_), RankFileName(rank)));
  }
  return f.writer.get();
}

Status OfflineCheckpointWriter::AddPiece(int rank, const std::string& name, DType dtype, const Shape& shape,
                                         const Layout& layout, const void* data, size_t bytes) {
  auto [it, fresh] = entries_.try_emplace(name, EntryRecord{name, dtype, shape, {}});
  if (fresh) order_.push_back(name);
  if (!fresh && (it->second.dtype != dtype || it->second.shape != shape)) {
    return InvalidArgument("entry '" + name + "' added with two dtypes or shapes");
  }
  if (bytes == 0) return Status::Ok();  // empty pieces need no chunk
  SC_ASSIGN_OR_RETURN(ShardFileWriter * writer, Writer(rank));
  SC_ASSIGN_OR_RETURN(uint64_t offset, writer->Append(data, bytes, DTypeSize(dtype)));
  ranks_[rank].chunks.emplace_back(name, ChunkRecord{0, offset, bytes, Normalize(layout, shape)});
  return Status::Ok();
}

Status OfflineCheckpointWriter::AddBlob(int rank, const std::string& name, BlobScope scope, const std::string& bytes) {
  SC_ASSIGN_OR_RETURN(ShardFileWriter * writer, Writer(rank));
  SC_ASSIGN_OR_RETURN(uint64_t offset, writer->Append(bytes.data(), bytes.size()));
  ranks_[rank].blobs.push_back(BlobRecord{name, scope, rank, 0, offset, bytes.size()});
  return Status::Ok();
}

Status OfflineCheckpointWriter::AddAlias(const std::string& name, const std::string& target) {
  auto it = entries_.find(target);
  if (it == entries_.end()) return InvalidArgument("alias '" + name + "' of '" + target + "', which is not an entry");
  if (!entries_.try_emplace(name, EntryRecord{name, it->second.dtype, it->second.shape, {}}).second) {
    return InvalidArgument("entry '" + name + "' added twice");
  }
  order_.push_back(name);
  aliases_.emplace_back(name, target);
  return Status::Ok();
}

Result<std::string> OfflineCheckpointWriter::Commit(const CreationInfo& created, int keep_last) {
  Manifest m;
  m.step = step_;
  m.world_size = world_;
  m.created = created;
  for (auto& [rank, f] : ranks_) {
    uint32_t file = static_cast<uint32_t>(m.files.size());
    SC_ASSIGN_OR_RETURN(FileRecord record, f.writer->Finish());
    m.files.push_back(record);
    for (auto& [name, chunk] : f.chunks) {
      chunk.file = file;
      entries_[name].chunks.push_back(chunk);
    }
    for (BlobRecord& b : f.blobs) {
      b.file = file;
      m.blobs.push_back(b);
    }
  }
  for (const auto& [name, target] : aliases_) entries_[name].chunks = entries_[target].chunks;
  for (const std::string& name : order_) m.entries.push_back(std::move(entries_[name]));
  RetentionPolicy retention;
  retention.keep_last = keep_last;
  SC_RETURN_IF_ERROR(CommitCheckpoint(root_, temp_name_, m, retention));
  committed_ = true;
  return JoinPath(root_, StepDirName(step_));
}

}  // namespace shardckpt
