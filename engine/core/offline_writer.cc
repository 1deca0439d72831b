#include "shardckpt/engine/core/offline_writer.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <future>
#include <optional>
#include <system_error>
#include <thread>

#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {
// Below this many chunks the manifest's entries are built on the calling thread alone: a thread
// costs more.
constexpr size_t kChunksWorthAThread = 16384;

// Elements per index of dim 0 of `shape` (1 for a 1-d tensor), 0 when there are none.
int64_t RowElements(const Shape& shape) {
  int64_t elements = 1;
  for (size_t d = 1; d < shape.size(); ++d) {
    if (shape[d] <= 0 || elements > INT64_MAX / shape[d]) return 0;
    elements *= shape[d];
  }
  return shape.empty() ? 0 : elements;
}

// Whether `layout` is a flat range of `bytes` (no overflow on the way: a range past any tensor's
// size is kept as given, for Commit's check to refuse).
bool IsFlatRangeOf(const Layout& layout, size_t element, uint64_t bytes) {
  int64_t count = 0;
  uint64_t range_bytes = 0;
  return layout.kind == LayoutKind::kFlatRange && !__builtin_sub_overflow(layout.end, layout.begin, &count) && count >= 0 &&
         !__builtin_mul_overflow(static_cast<uint64_t>(count), static_cast<uint64_t>(element), &range_bytes) &&
         range_bytes == bytes;
}

// Whether `layout` is a box of whole rows of `shape` (cut along dim 0 only) holding `bytes`;
// `row_elements` is 0 for a shape whose bytes overflow (kept as given).
bool IsRunOfRows(const Layout& layout, const Shape& shape, int64_t row_elements, size_t element, uint64_t bytes) {
  if (layout.kind != LayoutKind::kBox || row_elements <= 0 || layout.offsets.size() != shape.size() ||
      layout.sizes.size() != shape.size()) {
    return false;
  }
  for (size_t d = 1; d < shape.size(); ++d) {
    if (layout.offsets[d] != 0 || layout.sizes[d] != shape[d]) return false;
  }
  const uint64_t row_bytes = static_cast<uint64_t>(row_elements) * element;
  return layout.sizes[0] > 0 && bytes % row_bytes == 0 && bytes / row_bytes == static_cast<uint64_t>(layout.sizes[0]);
}

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
    entries_.push_back(WrittenEntry{name, DType::kUInt8, {}, 0, {}});
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
  WrittenEntry& record = entries_[entry];
  if (fresh) {
    record.dtype = dtype;
    record.shape = shape;
    // A shape of too many bytes keeps its pieces as given, for Commit's check to refuse.
    record.row_elements = NumBytes(shape, DTypeSize(dtype)).ok() ? RowElements(shape) : 0;
    record.pieces.reserve(entry_chunks);
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
  WrittenEntry& record = entries_[entry];
  SC_ASSIGN_OR_RETURN(ShardFileWriter * writer, Writer(rank));
  const size_t element = DTypeSize(record.dtype);
  SC_ASSIGN_OR_RETURN(uint64_t offset, writer->Append(data, bytes, element));
  Piece& piece = record.pieces.emplace_back();
  piece.rank = static_cast<uint32_t>(rank);
  piece.offset = offset;
  piece.bytes = bytes;
  if (NormalizesToWhole(layout, record.shape)) {
    piece.form = PieceForm::kWhole;
  } else if (IsFlatRangeOf(layout, element, bytes)) {
    piece.form = PieceForm::kFlatRange;
    piece.first = layout.begin;
  } else if (IsRunOfRows(layout, record.shape, record.row_elements, element, bytes)) {
    piece.form = PieceForm::kRows;
    piece.first = layout.offsets[0];
  } else {
    // Kept as given, so that Commit's check of the built manifest sees exactly what was added.
    other_layouts_.push_back(layout);
    piece.form = PieceForm::kOther;
    piece.first = static_cast<int64_t>(other_layouts_.size() - 1);
  }
  return Status::Ok();
}

Layout OfflineCheckpointWriter::LayoutOf(const WrittenEntry& entry, const Piece& piece) const {
  const int64_t elements = static_cast<int64_t>(piece.bytes / DTypeSize(entry.dtype));
  switch (piece.form) {
    case PieceForm::kWhole:
      return Layout::Whole();
    case PieceForm::kFlatRange:
      return Layout::FlatRange(piece.first, piece.first + elements);
    case PieceForm::kRows: {
      Layout box;
      box.kind = LayoutKind::kBox;
      box.offsets.resize(entry.shape.size(), 0);
      box.offsets[0] = piece.first;
      box.sizes = entry.shape;
      box.sizes[0] = elements / entry.row_elements;
      return box;
    }
    case PieceForm::kOther:
      break;
  }
  return other_layouts_[static_cast<size_t>(piece.first)];
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
  // Checked in ValidateManifest's order, then refused in EncodeManifest's: step, metrics and
  // files, the entries, the blobs; then the head's text, the entries' names, the blobs' names.
  // The entries one at a time, each made a manifest entry in one reused list, checked and
  // encoded while in cache; a large list in two parts side by side.
  std::vector<BlobRecord> blobs = std::move(m.blobs);
  m.blobs.clear();
  SC_RETURN_IF_ERROR(CheckBuiltManifest(m));
  std::vector<size_t> chunks_of(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) chunks_of[i] = i;
  // In the order added, so an alias of an alias takes the chunks its target took.
  for (const auto& [entry, target] : aliases_) chunks_of[entry] = chunks_of[target];
  size_t chunks = 0;
  for (size_t i = 0; i < entries_.size(); ++i) chunks += entries_[chunks_of[i]].pieces.size();
  size_t split = entries_.size();  // where the second part starts
  if (chunks >= kChunksWorthAThread && std::thread::hardware_concurrency() > 1) {
    size_t seen = 0;
    for (split = 0; split < entries_.size() && 2 * seen < chunks; ++split) seen += entries_[chunks_of[split]].pieces.size();
  }
  auto build = [&](ManifestBodyBuilder& body, size_t begin, size_t end) -> Status {
    EntryRecord built;
    for (size_t i = begin; i < end; ++i) {
      const WrittenEntry& holder = entries_[chunks_of[i]];
      built.name = entries_[i].name;
      built.dtype = holder.dtype;
      built.shape = holder.shape;
      built.chunks.clear();
      for (const Piece& p : holder.pieces) {
        ChunkRecord& c = built.chunks.emplace_back();
        c.file = p.rank;
        c.offset = p.offset;
        c.bytes = p.bytes;
        c.layout = LayoutOf(holder, p);
      }
      NumberChunkFiles(file_of_rank, &built.chunks);
      SC_RETURN_IF_ERROR(body.Add(built));
    }
    return Status::Ok();
  };
  ManifestBodyBuilder first(m, split, chunks);
  ManifestBodyBuilder second(m, entries_.size() - split, split < entries_.size() ? chunks / 2 : 0, split);
  std::future<Status> second_built;
  if (split < entries_.size()) {
    try {
      second_built = std::async(std::launch::async, [&] { return build(second, split, entries_.size()); });
    } catch (const std::system_error&) {  // no thread to be had (a pids limit): in turn below
    }
  }
  Status built = build(first, 0, split);
  if (split < entries_.size()) {
    if (!second_built.valid()) {
      if (built.ok()) built = build(second, split, entries_.size());
    } else if (built.ok()) {
      built = second_built.get();
    } else {
      second_built.wait();  // whatever it found comes after this error in entry order
    }
  }
  SC_RETURN_IF_ERROR(BuiltManifestError(built));
  m.blobs = std::move(blobs);
  SC_RETURN_IF_ERROR(CheckBuiltManifest(m));
  SC_RETURN_IF_ERROR(EncodeManifestWithBody(m, ManifestBody{}).status());  // the head's own text
  Result<ManifestBody> text = first.Finish(m.blobs, &second);
  SC_RETURN_IF_ERROR(BuiltManifestError(text.status()));
  // Done with the pieces: their memory goes back before the commit's writes and fsyncs.
  std::vector<WrittenEntry>().swap(entries_);
  std::vector<Layout>().swap(other_layouts_);
  entry_of_ = decltype(entry_of_)(0, EntryName{&entries_});
  SC_ASSIGN_OR_RETURN(const ManifestTextPieces pieces, EncodeManifestWithBody(m, *text));
  SC_RETURN_IF_ERROR(PublishCheckpoint(root_, temp_name_, step_, {pieces.head, pieces.body, pieces.seal}, std::nullopt,
                                       RetentionPolicy{}));
  committed_ = true;
  return JoinPath(root_, StepDirName(step_));
}

}  // namespace shardckpt
