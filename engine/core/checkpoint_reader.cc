#include "shardckpt/engine/core/checkpoint_reader.h"

#include <algorithm>
#include <cstring>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/io/checksum.h"

namespace shardckpt {

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path, IoOptions io) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  SC_ASSIGN_OR_RETURN(r->hold_, HoldCheckpoint(path));
  r->dir_ = r->hold_.dir();
  r->dcp_ = IsDcpFolder(r->dir_);
  SC_ASSIGN_OR_RETURN(r->manifest_, ReadManifest(r->dir_));
  r->index_ = std::make_unique<ChunkIndex>(&r->manifest_);
  ReadPlanOptions defaults;
  io.queue_depth = std::max<size_t>(io.queue_depth, 5);
  r->io_ = CreateIoEngine(io);
  SC_ASSIGN_OR_RETURN(r->pool_, BufferPool::Create(4, defaults.max_extent));
  r->windows_.resize(r->manifest_.files.size());
  const uint64_t share = kWindowBudget / std::max<size_t>(1, r->manifest_.files.size());
  r->window_bytes_ = AlignDown(std::clamp(share, kMinWindow, kMaxWindow), kBlockSize);
  return r;
}

Status CheckpointReader::Run(std::vector<CopyRequest> copies, const ReadTargets& targets) {
  ReadPlan plan = CoalesceReads(std::move(copies), ReadPlanOptions{});
  return ExecuteReadPlan(io_.get(), pool_.get(), dir_, manifest_, plan, targets, true, &stats_);
}

Result<const CheckpointReader::Window*> CheckpointReader::WindowFor(uint32_t file, uint64_t begin, uint64_t end) {
  Window& w = windows_[file];
  if (begin >= w.offset && end <= w.offset + w.size) return &w;
  const uint64_t from = AlignDown(begin, kBlockSize);
  if (AlignUp(end, kBlockSize) - from > window_bytes_) return nullptr;
  const uint64_t to = std::min(manifest_.files[file].table_offset, from + window_bytes_);
  if (w.bytes.data() == nullptr) {
    SC_ASSIGN_OR_RETURN(w.bytes, AlignedBuffer::Allocate(window_bytes_));
  }
  w.offset = from;
  w.size = 0;  // never serve a window that failed
  Status read = Run({CopyRequest{file, from, to - from, 0, 0}},
                    ReadTargets{{w.bytes.data()}, {"read-ahead of " + manifest_.files[file].name}});
  if (!read.ok()) {
    // A damaged block elsewhere in the window must not fail a piece that does not touch it, and
    // a damaged block of this piece is reported naming it: the piece is read on its own.
    if (read.code() == Code::kDataLoss) return nullptr;
    return read;
  }
  w.size = to - from;
  return &w;
}

Status CheckpointReader::ReadPiece(size_t entry, const Layout& layout, void* out) {
  // The lists are members, cleared per piece: a piece of a small entry is cut from dozens of
  // chunks, and growing fresh lists for each of a hundred thousand pieces cost more than planning.
  std::vector<CopyRequest>& copies = piece_copies_;
  std::vector<CopyRequest>& direct = piece_direct_;
  copies.clear();
  direct.clear();
  wanted_.assign(1, WantedPiece{entry, layout, 0});
  PlanPieceCopies(manifest_, *index_, wanted_, &copies);
  auto* target = static_cast<unsigned char*>(out);
  const std::string& name = manifest_.entries[entry].name;
  // Small copies (a piece of a small entry, cut from the chunks of several files) come from the
  // windows; anything wider goes through one plan of its own.
  for (const CopyRequest& c : copies) {
    Result<const Window*> w = WindowFor(c.file, c.file_offset, c.file_offset + c.length);
    if (!w.ok()) return w.status().WithContext(name);
    if (*w == nullptr) {
      direct.push_back(c);
      continue;
    }
    std::memcpy(target + c.target_offset, (*w)->bytes.data() + (c.file_offset - (*w)->offset), c.length);
  }
  if (direct.empty()) return Status::Ok();
  return Run(direct, ReadTargets{{target}, {name}});
}

Result<std::string> CheckpointReader::ReadBlob(const BlobRecord& blob) {
  std::string bytes(blob.bytes, '\0');
  SC_RETURN_IF_ERROR(Run({CopyRequest{blob.file, blob.offset, blob.bytes, 0, 0}},
                         ReadTargets{{reinterpret_cast<unsigned char*>(bytes.data())}, {"blob " + blob.name}}));
  if (dcp_) {
    Result<std::string> value = DcpByteItemValue(bytes, blob.name);
    if (value.ok()) return value;
  }
  return bytes;
}

}  // namespace shardckpt
