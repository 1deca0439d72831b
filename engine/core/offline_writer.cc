#include "shardckpt/engine/core/offline_writer.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <optional>
#include <system_error>

#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {
// Staging: every file of the world is open at once (a reshard adds each entry's pieces to all of
// them in a row), so the files share one budget (past 32 files each still gets 4 x 128 KiB), each
// with a few buffers so that its writes start while the rest of its bytes are still coming. With
// one 1 MiB buffer each, a reshard to 64 ranks of 56 MB wrote nothing until the end: every file's
// bytes fit in its first buffer.
constexpr uint64_t kStagingBudget = 16u << 20, kBuffersPerFile = 4, kMinBuffer = 128u << 10, kMaxBuffer = 1u << 20;
}  // namespace

Result<std::unique_ptr<OfflineCheckpointWriter>> OfflineCheckpointWriter::Begin(const std::string& root, int64_t step,
                                                                              int world) {
  if (world < 1) return InvalidArgument("world size must be at least 1");
  if (world > kMaxWorldSize) {
    return InvalidArgument("world size " + std::to_string(world) + " is above the format's limit of " +
                           std::to_string(kMaxWorldSize) + " ranks");
  }
  SC_RETURN_IF_ERROR(ValidateStep(step));
  std::unique_ptr<OfflineCheckpointWriter> w(new OfflineCheckpointWriter());
  SC_ASSIGN_OR_RETURN(RootLock lock, LockRootForSave(root, step));
  w->lock_ = std::make_unique<RootLock>(std::move(lock));
  w->root_ = root;
  w->step_ = step;
  w->world_ = world;
  w->temp_name_ = TempDirName(step, RandomId());
  w->ranks_.resize(static_cast<size_t>(world));
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
  RankFile& f = ranks_[static_cast<size_t>(rank)];
  if (!f.writer) {
    const uint64_t buffer = std::clamp<uint64_t>(kStagingBudget / (kBuffersPerFile * static_cast<uint64_t>(world_)),
                                                 kMinBuffer, kMaxBuffer);
    SC_ASSIGN_OR_RETURN(f.pool, BufferPool::Create(kBuffersPerFile, buffer));
    IoOptions io;
    io.queue_depth = kBuffersPerFile + 1;
    f.io = CreateIoEngine(io);
    f.writer = std::make_unique<ShardFileWriter>(f.io.get(), f.pool.get(), /*always_stage=*/true);
    SC_RETURN_IF_ERROR(f.writer->Open(JoinPath(root_, temp_name_), RankFileName(rank)));
  }
  return f.writer.get();
}

void OfflineCheckpointWriter::ReserveEntries(size_t entries) {
  entries_.reserve(entries);
  entry_of_.Reserve(entries);
}

Result<size_t> OfflineCheckpointWriter::EntryIndex(const std::string& name, bool* fresh) {
  *fresh = false;
  if (last_entry_ < entries_.size() && entries_[last_entry_].name == name) return last_entry_;
  uint32_t index = entry_of_.Find(name);
  if (index == decltype(entry_of_)::kAbsent) {
    // Checked once per entry, where entries are made (tensors and aliases alike).
    if (name.find('\0') != std::string::npos) {
      return InvalidArgument("tensor '" + WithNulsShown(name) +
                             "': its name has a NUL byte in it (no checkpoint entry may): rename it first");
    }
    if (entries_.size() >= decltype(entry_of_)::kAbsent) return InvalidArgument("more entries than a checkpoint can hold");
    index = static_cast<uint32_t>(entries_.size());
    entries_.push_back(EntryRecord{name, DType::kUInt8, {}, {}});
    entry_of_.TryEmplace(name, index);
    *fresh = true;
  }
  last_entry_ = index;
  return index;
}

Result<size_t> OfflineCheckpointWriter::Entry(const std::string& name, DType dtype, const Shape& shape,
                                              size_t entry_chunks) {
  bool fresh = false;
  SC_ASSIGN_OR_RETURN(const size_t entry, EntryIndex(name, &fresh));
  EntryRecord& record = entries_[entry];
  if (fresh) {
    record.dtype = dtype;
    record.shape = shape;
    record.chunks.reserve(entry_chunks);
  } else if (record.dtype != dtype || record.shape != shape) {
    return InvalidArgument("entry '" + name + "' added with two dtypes or shapes");
  }
  return entry;
}

Status OfflineCheckpointWriter::AddPiece(int rank, const std::string& name, DType dtype, const Shape& shape,
                                         const Layout& layout, const void* data, size_t bytes, size_t entry_chunks) {
  SC_ASSIGN_OR_RETURN(const size_t entry, Entry(name, dtype, shape, entry_chunks));
  return AddPieceTo(entry, rank, layout, data, bytes);
}

Status OfflineCheckpointWriter::AddPieceTo(size_t entry, int rank, const Layout& layout, const void* data, size_t bytes) {
  if (entry >= entries_.size()) return InvalidArgument("no entry " + std::to_string(entry) + " was made");
  if (bytes == 0) return Status::Ok();  // empty pieces need no chunk
  EntryRecord& record = entries_[entry];
  SC_ASSIGN_OR_RETURN(ShardFileWriter * writer, Writer(rank));
  SC_ASSIGN_OR_RETURN(uint64_t offset, writer->Append(data, bytes, DTypeSize(record.dtype)));
  // Straight into the entry, the rank standing in for the file index until Commit numbers the
  // files: no second list of every chunk to move over at Commit (millions with small tensors).
  ChunkRecord& chunk = record.chunks.emplace_back();
  chunk.file = static_cast<uint32_t>(rank);
  chunk.offset = offset;
  chunk.bytes = bytes;
  if (!NormalizesToWhole(layout, record.shape)) chunk.layout = layout;
  return Status::Ok();
}

Status OfflineCheckpointWriter::AddBlob(int rank, const std::string& name, BlobScope scope, const std::string& bytes) {
  if (name.find('\0') != std::string::npos) {
    return InvalidArgument("value '" + WithNulsShown(name) +
                           "': its name has a NUL byte in it (no checkpoint value may): rename it first");
  }
  SC_ASSIGN_OR_RETURN(ShardFileWriter * writer, Writer(rank));
  SC_ASSIGN_OR_RETURN(uint64_t offset, writer->Append(bytes.data(), bytes.size()));
  ranks_[static_cast<size_t>(rank)].blobs.push_back(BlobRecord{name, scope, rank, 0, offset, bytes.size()});
  return Status::Ok();
}

Status OfflineCheckpointWriter::AddAlias(const std::string& name, const std::string& target) {
  const uint32_t to = entry_of_.Find(target);
  if (to == decltype(entry_of_)::kAbsent) return InvalidArgument("alias '" + name + "' of '" + target + "', which is not an entry");
  bool fresh = false;
  SC_ASSIGN_OR_RETURN(const size_t entry, EntryIndex(name, &fresh));
  if (!fresh) return InvalidArgument("entry '" + name + "' added twice");
  entries_[entry].dtype = entries_[to].dtype;
  entries_[entry].shape = entries_[to].shape;
  aliases_.emplace_back(entry, to);
  return Status::Ok();
}

namespace {

// Chunks were added naming their rank (AddPiece); the manifest names the file and lists an
// entry's chunks in file order, each file's in the order they were added (a stable sort, and
// none at all for the usual rank-by-rank adds).
void NumberChunkFiles(const std::vector<uint32_t>& file_of_rank, ChunkRecords* chunks) {
  for (ChunkRecord& c : *chunks) c.file = file_of_rank[c.file];
  auto by_file = [](const ChunkRecord& a, const ChunkRecord& b) { return a.file < b.file; };
  if (!std::is_sorted(chunks->begin(), chunks->end(), by_file)) std::stable_sort(chunks->begin(), chunks->end(), by_file);
}

// Finishes every rank's file (last writes, checksum table, fdatasync), several at once: each
// file has its own ring and staging, and one at a time a reshard to 64 ranks spent 60 ms here,
// mostly waiting on 64 fdatasyncs in a row. The records come back by rank; the first failure, in
// rank order, is the one returned (each names its file).
Result<std::vector<std::optional<FileRecord>>> FinishAll(std::vector<ShardFileWriter*> writers) {
  constexpr size_t kAtOnce = 8;  // threads: each mostly waits on the device
  std::vector<Result<FileRecord>> done(writers.size(), Internal("not finished"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < writers.size();) {
      if (writers[i] != nullptr) done[i] = writers[i]->Finish();
    }
  };
  std::vector<std::future<void>> helpers;
  for (size_t t = 1; t < std::min(kAtOnce, writers.size()); ++t) {
    try {
      helpers.push_back(std::async(std::launch::async, work));
    } catch (const std::system_error&) {  // no thread to be had (a pids limit): fewer helpers
      break;
    }
  }
  work();
  for (std::future<void>& h : helpers) h.get();
  std::vector<std::optional<FileRecord>> records(writers.size());
  for (size_t i = 0; i < writers.size(); ++i) {
    if (writers[i] == nullptr) continue;
    if (!done[i].ok()) return done[i].status();
    records[i] = std::move(*done[i]);
  }
  return records;
}

}  // namespace

Result<std::string> OfflineCheckpointWriter::Commit(const CreationInfo& created, const std::map<std::string, double>& metrics) {
  Manifest m;
  m.step = step_;
  m.world_size = world_;
  m.created = created;
  m.metrics = metrics;
  std::vector<ShardFileWriter*> writers;
  for (RankFile& f : ranks_) writers.push_back(f.writer.get());
  SC_ASSIGN_OR_RETURN(std::vector<std::optional<FileRecord>> finished, FinishAll(std::move(writers)));
  std::vector<uint32_t> file_of_rank(ranks_.size(), 0);
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    RankFile& f = ranks_[rank];
    if (!f.writer) continue;
    uint32_t file = static_cast<uint32_t>(m.files.size());
    file_of_rank[rank] = file;
    m.files.push_back(std::move(*finished[rank]));
    for (BlobRecord& b : f.blobs) {
      b.file = file;
      m.blobs.push_back(b);
    }
  }
  for (EntryRecord& e : entries_) NumberChunkFiles(file_of_rank, &e.chunks);
  for (const auto& [entry, target] : aliases_) entries_[entry].chunks = entries_[target].chunks;
  m.entries = std::move(entries_);
  entries_.clear();
  entry_of_ = decltype(entry_of_)(0, EntryName{&entries_});
  SC_RETURN_IF_ERROR(CommitCheckpoint(root_, temp_name_, m, RetentionPolicy{}));
  committed_ = true;
  return JoinPath(root_, StepDirName(step_));
}

}  // namespace shardckpt
