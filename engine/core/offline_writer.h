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
#include "shardckpt/engine/model/name_index.h"
#include "shardckpt/engine/core/shard_writer.h"

namespace shardckpt {

class OfflineCheckpointWriter {
 public:
  static Result<std::unique_ptr<OfflineCheckpointWriter>> Begin(const std::string& root, int64_t step, int world);
  ~OfflineCheckpointWriter();
  OfflineCheckpointWriter(const OfflineCheckpointWriter&) = delete;  // entry_of_ points at entries_
  OfflineCheckpointWriter& operator=(const OfflineCheckpointWriter&) = delete;

  // Room for `entries` entries, when the caller knows how many it will add (a reshard adds its
  // source's): the name index is then never rebuilt while it grows.
  void ReserveEntries(size_t entries);
  // `entry_chunks`: how many chunks the entry will have, when the caller knows (a reshard adds
  // one per rank in a row); its list is then allocated once instead of grown chunk by chunk.
  Status AddPiece(int rank, const std::string& name, DType dtype, const Shape& shape, const Layout& layout,
                  const void* data, size_t bytes, size_t entry_chunks = 0);
  // AddPiece in two steps, for a caller adding many pieces of one entry in a row (a reshard to 64
  // ranks adds 630,000): the entry is found or made, and its dtype and shape checked, once.
  Result<size_t> Entry(const std::string& name, DType dtype, const Shape& shape, size_t entry_chunks = 0);
  Status AddPieceTo(size_t entry, int rank, const Layout& layout, const void* data, size_t bytes);
  Status AddBlob(int rank, const std::string& name, BlobScope scope, const std::string& bytes);
  // `name` is the entry `target` under a second name (tied weights): its manifest entry points at
  // the same chunks, so the bytes are stored once. `target` must be added (before Commit).
  Status AddAlias(const std::string& name, const std::string& target);
  // Returns the committed folder. `metrics`: recorded in the manifest (a reshard keeps its
  // source's, so keep-best retention and `list` still rank the checkpoint).
  Result<std::string> Commit(const CreationInfo& created, const std::map<std::string, double>& metrics = {});

 private:
  OfflineCheckpointWriter() = default;
  Result<ShardFileWriter*> Writer(int rank);
  // The index of entry `name` in entries_, added when new (a name with a NUL byte is refused);
  // the last one found is checked first (a reshard adds every rank's piece of one entry in a row).
  Result<size_t> EntryIndex(const std::string& name, bool* fresh);

  struct RankFile {
    std::unique_ptr<IoEngine> io;
    std::unique_ptr<BufferPool> pool;
    std::unique_ptr<ShardFileWriter> writer;
    std::vector<BlobRecord> blobs;
  };
  std::unique_ptr<RootLock> lock_;
  std::string root_, temp_name_;
  int64_t step_ = 0;
  int world_ = 1;
  bool committed_ = false;
  std::vector<RankFile> ranks_;  // by rank; a rank with no writer has no file
  // A chunk as added, 32 bytes: the rank standing in for its file until Commit numbers the
  // files, and its layout by form. The pieces of a reshard or import are a whole tensor, a flat
  // range or a run of whole rows (dim 0), each told by one number and the piece's bytes; any other
  // layout is kept aside. Why: a reshard to 64 ranks of 20,000 tensors adds 630,000 chunks, and a
  // ChunkRecord of each (128 bytes, two inline boxes) was 80 MB of fresh memory, faulted in,
  // encoded, checked and freed (42% of that reshard's page faults, benchmarks/README.md).
  enum class PieceForm : uint32_t { kWhole, kFlatRange, kRows, kOther };
  struct Piece {
    uint32_t rank = 0;
    PieceForm form = PieceForm::kWhole;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    int64_t first = 0;  // kFlatRange: its first element; kRows: its first row; kOther: index in other_layouts_
  };
  struct WrittenEntry {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;
    int64_t row_elements = 0;  // elements per index of dim 0 (1 for a 1-d tensor)
    std::vector<Piece> pieces;
  };
  // The layout `piece` of `entry` stands for.
  Layout LayoutOf(const WrittenEntry& entry, const Piece& piece) const;

  // Entries in the order first added (the manifest keeps the caller's order), found by name.
  std::vector<WrittenEntry> entries_;
  std::vector<Layout> other_layouts_;
  // By name, as indices into entries_ (a node map's malloc, name copy and cold node per entry were
  // 10-15% of a reshard of 20,000 small tensors, perf 2026-12-07).
  struct EntryName {
    const std::vector<WrittenEntry>* entries;
    std::string_view operator()(uint32_t i) const { return (*entries)[i].name; }
  };
  NameIndex<EntryName> entry_of_{0, EntryName{&entries_}};
  size_t last_entry_ = 0;
  std::vector<std::pair<size_t, size_t>> aliases_;  // entry, target entry
};

}  // namespace shardckpt
