#include "shardckpt/engine/core/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <system_error>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/model/name_list.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

std::vector<size_t> AllBlobs(const Manifest& m) {
  std::vector<size_t> all(m.blobs.size());
  for (size_t b = 0; b < all.size(); ++b) all[b] = b;
  return all;
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path, IoOptions io) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  SC_ASSIGN_OR_RETURN(r->hold_, HoldCheckpoint(path));
  r->dir_ = r->hold_.dir();
  r->dcp_ = IsDcpFolder(r->dir_);
  // The data files are checked (present, their recorded sizes) when a read first needs each one
  // (CheckFile), not all here: a consolidation of some entries must not fail on a file that
  // holds none of them (the tools call CheckWantedFiles first, to fail before writing).
  if (r->dcp_) {
    SC_ASSIGN_OR_RETURN(r->manifest_, ReadManifest(r->dir_));
  } else {
    SC_ASSIGN_OR_RETURN(r->manifest_, ReadManifestFile(JoinPath(r->dir_, kManifestName)));
  }
  r->file_checked_.assign(r->manifest_.files.size(), r->dcp_);  // a DCP folder's files have no recorded size
  if (r->dcp_) {
    // A DCP folder has no checksums of its own; where export left a .sha256 beside its files,
    // they are checked before the folder is read whole into something new (sha256_sidecar.h).
    uint64_t summed = 0, bytes = 0;
    std::vector<DcpProblem> problems = CheckDcpSha256Files(r->dir_, r->manifest_, &summed, &bytes);
    if (!problems.empty()) {
      return DataLoss(JoinPath(r->dir_, problems[0].file) + ": " + problems[0].what +
                      (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more files)" : "") +
                      "; `shardckpt verify " + r->dir_ + "` lists each");
    }
    if (summed > 0) SC_LOG(kInfo) << r->dir_ << ": " << summed << " files matched the .sha256 beside them";
  }
  r->index_ = std::make_unique<ChunkIndex>(&r->manifest_);
  ReadPlanOptions defaults;
  io.queue_depth = std::max<size_t>(io.queue_depth, 5);
  r->io_ = CreateIoEngine(io);
  SC_ASSIGN_OR_RETURN(r->pool_, BufferPool::Create(4, defaults.max_extent));
  r->windows_.resize(r->manifest_.files.size());
  r->ahead_.resize(r->manifest_.files.size());
  const uint64_t share = kWindowBudget / std::max<size_t>(1, r->manifest_.files.size());
  r->window_bytes_ = AlignDown(std::clamp(share, kMinWindow, kMaxWindow), kBlockSize);
  r->wide_.resize(r->manifest_.files.size());
  r->damaged_.resize(r->manifest_.files.size());
  for (const EntryRecord& e : r->manifest_.entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (r->WiderThanWindow(c.offset, c.offset + c.bytes)) {
        r->wide_[c.file].emplace_back(c.offset, c.offset + c.bytes);
      }
    }
  }
  for (auto& wide : r->wide_) std::sort(wide.begin(), wide.end());
  return r;
}

Status CheckpointReader::CheckFile(uint32_t file) {
  if (file_checked_[file]) return Status::Ok();
  SC_RETURN_IF_ERROR(CheckDataFilesIn(dir_, {manifest_.files[file]}));
  file_checked_[file] = 1;
  return Status::Ok();
}

Status CheckpointReader::CheckWantedFiles(const std::vector<size_t>& blobs) {
  std::vector<bool> blob_file(manifest_.files.size(), false);
  for (size_t b : blobs) blob_file[manifest_.blobs.at(b).file] = true;
  for (uint32_t file = 0; file < manifest_.files.size(); ++file) {
    if (!wanted_.empty() && wanted_[file].empty() && !blob_file[file]) continue;
    Status checked = CheckFile(file);
    if (checked.ok()) continue;
    std::vector<std::string> held;  // the wanted entries and values it holds, for the message
    for (size_t entry = 0; entry < manifest_.entries.size(); ++entry) {
      if (!wanted_entries_.empty() && !wanted_entries_[entry]) continue;
      const EntryRecord& e = manifest_.entries[entry];
      if (std::any_of(e.chunks.begin(), e.chunks.end(), [&](const ChunkRecord& c) { return c.file == file && c.bytes > 0; })) {
        held.push_back(e.name);
      }
    }
    for (size_t b : blobs) {
      if (manifest_.blobs[b].file == file) held.push_back(manifest_.blobs[b].name);
    }
    return held.empty() ? checked : checked.WithContext("the file holding " + NameList(held));
  }
  return Status::Ok();
}

Status CheckpointReader::Run(std::vector<CopyRequest> copies, const ReadTargets& targets) {
  ReadPlan plan = CoalesceReads(std::move(copies), ReadPlanOptions{});
  return ExecuteReadPlan(io_.get(), pool_.get(), dir_, manifest_, plan, targets, true, &stats_);
}

void CheckpointReader::ReadOnly(const std::vector<size_t>& entries) {
  // A background read uses wanted_: it ends first, and windows read under the old rule go.
  JoinFirstWindows();
  JoinAhead();
  for (size_t file = 0; file < windows_.size(); ++file) {
    windows_[file].size = 0;
    if (ahead_[file].done.valid()) TakeAhead(static_cast<uint32_t>(file));
  }
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(manifest_.files.size());
  wanted_entries_.assign(manifest_.entries.size(), false);
  for (size_t entry : entries) {
    wanted_entries_.at(entry) = true;
    for (const ChunkRecord& c : manifest_.entries.at(entry).chunks) {
      if (c.bytes > 0) spans[c.file].emplace_back(AlignDown(c.offset, kBlockSize), AlignUp(c.offset + c.bytes, kBlockSize));
    }
  }
  for (auto& file : spans) {
    std::sort(file.begin(), file.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& span : file) {
      if (!merged.empty() && span.first <= merged.back().second + kWindowGap) {
        merged.back().second = std::max(merged.back().second, span.second);
      } else {
        merged.push_back(span);
      }
    }
    file = std::move(merged);
  }
  wanted_ = std::move(spans);
}

uint64_t CheckpointReader::WantedEnd(uint32_t file, uint64_t offset) const {
  if (wanted_.empty()) return UINT64_MAX;
  const auto& spans = wanted_[file];
  auto it = std::upper_bound(spans.begin(), spans.end(), offset,
                             [](uint64_t at, const std::pair<uint64_t, uint64_t>& span) { return at < span.second; });
  return it != spans.end() && it->first <= offset ? it->second : 0;
}

bool CheckpointReader::WiderThanWindow(uint64_t begin, uint64_t end) const {
  return AlignUp(end, kBlockSize) - AlignDown(begin, kBlockSize) > window_bytes_;
}

uint64_t CheckpointReader::WindowEnd(uint32_t file, uint64_t from) const {
  uint64_t to = std::min(manifest_.files[file].table_offset, from + window_bytes_);
  // Whatever is asked for is read: a span's end only cuts a window that starts inside it.
  if (const uint64_t wanted_end = WantedEnd(file, from); wanted_end > from) to = std::min(to, wanted_end);
  // Nor does a window run on into a chunk wider than a window, which is read on its own: a small
  // tensor before each large one read 4 MiB of the large one for nothing (1.4x the checkpoint's
  // bytes read by a consolidation of a model of alternating norms and weights).
  const auto& wide = wide_[file];
  auto next = std::upper_bound(wide.begin(), wide.end(), std::make_pair(from, UINT64_MAX));
  if (next != wide.end()) to = std::min(to, std::max(AlignUp(next->first, kBlockSize), from + kBlockSize));
  return to;
}

bool CheckpointReader::CutAtWideChunk(uint32_t file, uint64_t from, uint64_t to) const {
  const auto& wide = wide_[file];
  auto next = std::upper_bound(wide.begin(), wide.end(), std::make_pair(from, UINT64_MAX));
  return next != wide.end() && std::max(AlignUp(next->first, kBlockSize), from + kBlockSize) == to;
}

void CheckpointReader::MarkDamaged(uint32_t file, uint64_t from) {
  damaged_[file].emplace_back(from, WindowEnd(file, from));
}

bool CheckpointReader::InDamagedWindow(uint32_t file, uint64_t begin, uint64_t end) const {
  for (const auto& [from, to] : damaged_[file]) {
    if (begin < to && end > from) return true;
  }
  return false;
}

HostAllocator CheckpointReader::WindowMemory(uint32_t file) const {
  // Two windows per file (the one served and the one read ahead), in turn.
  return AllocatorForReuse(manifest_.files[file].table_offset, 2 * window_bytes_);
}

Status CheckpointReader::ReadWindow(uint32_t file, uint64_t from, Window* into, IoEngine* io, BufferPool* pool,
                                    ReadStats* stats) {
  const uint64_t to = WindowEnd(file, from);
  if (into->bytes.data() == nullptr) {
    SC_ASSIGN_OR_RETURN(into->bytes, AlignedBuffer::Allocate(window_bytes_, WindowMemory(file)));
  }
  into->offset = from;
  into->size = 0;  // never serve a window that failed
  // Cut into parts (CoalesceReads splits the copy, each part still read straight into the
  // window), several in flight: one 8 MiB read at a time kept this VM's disk at two thirds of its
  // rate.
  ReadPlanOptions cut;
  cut.max_extent = kWindowPart;
  const ReadPlan plan = CoalesceReads({CopyRequest{file, from, to - from, 0, 0}}, cut);
  const std::string label = "read-ahead of " + manifest_.files[file].name;
  SC_RETURN_IF_ERROR(
      ExecuteReadPlan(io, pool, dir_, manifest_, plan, ReadTargets{{into->bytes.data()}, {label}, {}}, true, stats));
  into->size = to - from;
  return Status::Ok();
}

void CheckpointReader::ReadFirstWindowsAhead() {
  JoinFirstWindows();
  if (windows_.empty()) return;
  try {
    first_done_ = std::async(std::launch::async, [this]() -> Status {
      try {
        return ReadFirstWindows();
      } catch (const std::exception& e) {  // (memory): the foreground reads will say what fails
        return Internal(std::string("first windows: ") + e.what());
      }
    });
  } catch (const std::exception& e) {  // no thread to be had (a pids limit, memory): read when needed
    LogOnce(LogLevel::kInfo, "checkpoint-reader-first", std::string("reading first windows when needed, not ahead: ") + e.what());
  }
}

Status CheckpointReader::ReadFirstWindows() {
  // Each file's first window starts at the block of its first chunk that windows serve (one
  // within a window's size, CopyFromWindows), among the wanted bytes after ReadOnly: the window
  // the walk would read there first. A file whose chunks are all wider than a window gets none:
  // its pieces are read on their own, and a window there would be read for nothing.
  std::vector<uint64_t> first(windows_.size(), UINT64_MAX);
  for (const EntryRecord& e : manifest_.entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (c.bytes == 0 || c.offset >= first[c.file]) continue;
      if (WiderThanWindow(c.offset, c.offset + c.bytes)) continue;
      if (WantedEnd(c.file, c.offset) <= c.offset) continue;  // not a wanted entry's
      first[c.file] = c.offset;
    }
  }
  std::vector<CopyRequest> copies;
  std::vector<unsigned char*> bases;
  std::vector<std::string> labels;
  uint64_t budget = kWindowBudget;
  for (uint32_t file = 0; file < windows_.size() && budget >= window_bytes_; ++file) {
    Window& w = windows_[file];
    if (first[file] == UINT64_MAX || w.size > 0) continue;
    const uint64_t from = AlignDown(first[file], kBlockSize);
    const uint64_t to = WindowEnd(file, from);
    if (to <= from) continue;
    if (w.bytes.data() == nullptr) {
      SC_ASSIGN_OR_RETURN(w.bytes, AlignedBuffer::Allocate(window_bytes_, WindowMemory(file)));
    }
    budget -= window_bytes_;
    copies.push_back(CopyRequest{file, from, to - from, static_cast<uint32_t>(bases.size()), 0});
    bases.push_back(w.bytes.data());
    labels.push_back("read-ahead of " + manifest_.files[file].name);
    first_windows_.push_back(FirstWindow{file, from, to - from, false, false});
  }
  if (copies.empty()) return Status::Ok();
  SC_ASSIGN_OR_RETURN(std::unique_ptr<BufferPool> pool, BufferPool::Create(kFirstWindowsInFlight, kWindowPart));
  IoOptions io;
  io.queue_depth = kFirstWindowsInFlight + 1;
  std::unique_ptr<IoEngine> engine = CreateIoEngine(io);
  ReadPlanOptions cut;
  cut.max_extent = kWindowPart;
  const std::vector<std::string_view> names(labels.begin(), labels.end());
  Status read = ExecuteReadPlan(engine.get(), pool.get(), dir_, manifest_, CoalesceReads(copies, cut),
                                ReadTargets{bases, names, {}}, true, &first_stats_);
  if (read.ok()) {
    for (FirstWindow& f : first_windows_) f.read = true;
    return read;
  }
  // A plan stops at its first failure (a damaged block): each file's window is read again on its
  // own, so that only the failing ones are left to be read (and reported) when a piece needs them.
  for (size_t i = 0; i < copies.size(); ++i) {
    CopyRequest one = copies[i];
    one.target = 0;
    const Status alone = ExecuteReadPlan(engine.get(), pool.get(), dir_, manifest_, CoalesceReads({one}, cut),
                                         ReadTargets{{bases[i]}, {names[i]}, {}}, true, &first_stats_);
    first_windows_[i].read = alone.ok();
    first_windows_[i].damaged = alone.code() == Code::kDataLoss;
  }
  return read;
}

void CheckpointReader::JoinFirstWindows() {
  if (!first_done_.valid()) return;
  first_done_.get().IgnoreError();  // a window that failed is read again when needed, which reports
  for (const FirstWindow& f : first_windows_) {
    if (!f.read) {
      if (f.damaged) MarkDamaged(f.file, f.from);  // its pieces are read on their own, which says what fails
      continue;
    }
    windows_[f.file].offset = f.from;
    windows_[f.file].size = f.size;
    first_windows_kept_++;
  }
  first_windows_.clear();
  CountReadAhead(&first_stats_);
}

void CheckpointReader::CountReadAhead(ReadStats* read) {
  stats_.data_bytes_read += read->data_bytes_read;
  stats_.table_bytes_read += read->table_bytes_read;
  stats_.extents += read->extents;
  stats_.bytes_read_in_place += read->bytes_read_in_place;
  stats_.bytes_read_ahead += read->data_bytes_read;
  *read = ReadStats{};
}

void CheckpointReader::JoinAhead() {
  if (reading_ahead_ < 0) return;
  ahead_[static_cast<size_t>(reading_ahead_)].done.wait();
  reading_ahead_ = -1;
  CountReadAhead(&ahead_stats_);
}

bool CheckpointReader::TakeAhead(uint32_t file) {
  Ahead& a = ahead_[file];
  if (!a.done.valid()) return false;
  if (reading_ahead_ == static_cast<int64_t>(file)) JoinAhead();
  return a.done.get().ok();
}

void CheckpointReader::StartAhead(uint32_t file) {
  const Window& w = windows_[file];
  const uint64_t from = w.offset + w.size;
  if (w.size == 0 || from >= manifest_.files[file].table_offset) return;
  if (WantedEnd(file, from) == 0) return;  // the next bytes are none the caller reads
  if (CutAtWideChunk(file, w.offset, from)) return;  // nor are they: a chunk read on its own starts there
  JoinAhead();  // one at a time; its result stays with its file until taken
  Ahead& a = ahead_[file];
  if (a.done.valid()) TakeAhead(file);
  // Reading ahead only saves time: when it cannot be set up, windows are read when needed.
  auto skip = [](const std::string& why) {
    LogOnce(LogLevel::kInfo, "checkpoint-reader-ahead", "reading windows when needed, not ahead: " + why);
  };
  if (ahead_pool_ == nullptr) {
    Result<std::unique_ptr<BufferPool>> pool = BufferPool::Create(kPartsInFlight, kWindowPart);
    if (!pool.ok()) return skip(pool.status().ToString());
    IoOptions io;
    io.queue_depth = kPartsInFlight + 1;
    ahead_io_ = CreateIoEngine(io);
    ahead_pool_ = std::move(*pool);
  }
  a.from = from;
  try {
    a.done = std::async(std::launch::async, [this, file, from, into = &a.window]() -> Status {
      try {
        return ReadWindow(file, from, into, ahead_io_.get(), ahead_pool_.get(), &ahead_stats_);
      } catch (const std::exception& e) {  // (memory): the foreground read will say what fails
        return Internal(std::string("read-ahead: ") + e.what());
      }
    });
  } catch (const std::exception& e) {  // no thread to be had (a pids limit, memory)
    return skip(e.what());
  }
  reading_ahead_ = file;
}

Result<bool> CheckpointReader::CopyFromWindows(const CopyRequest& c, unsigned char* target) {
  if (c.length == 0) return true;  // nothing to read (a DCP folder's empty chunk): no window moved
  JoinFirstWindows();
  const uint64_t begin = c.file_offset, end = c.file_offset + c.length;
  Window& w = windows_[c.file];
  if (begin >= w.offset && end <= w.offset + w.size) {
    std::memcpy(target, w.bytes.data() + (begin - w.offset), c.length);
    return true;
  }
  if (WiderThanWindow(begin, end)) return false;
  // Near a damaged block, not another window for each piece (a window read, a verification and a
  // message built per piece: minutes for a few hundred thousand pieces): each piece alone.
  if (InDamagedWindow(c.file, begin, end)) return false;
  // The window after this one serves the piece when it starts there, or starts here and runs on
  // into it (its head copied from here): read in the background if the walk went forward, else
  // now. Either way each block of a file walked in order is read once.
  Ahead& a = ahead_[c.file];
  const uint64_t next_from = w.offset + w.size;
  const bool straddles = w.size > 0 && begin >= w.offset && begin < next_from;
  bool next = false;
  if (a.done.valid()) {
    next = TakeAhead(c.file) && a.from == next_from && (straddles || begin >= next_from) &&
           end <= a.from + a.window.size;  // else a jump elsewhere, or a failed read (done again below)
  }
  if (!next && straddles && next_from < manifest_.files[c.file].table_offset) {
    Status read = ReadWindow(c.file, next_from, &a.window, io_.get(), pool_.get(), &stats_);
    if (!read.ok() && read.code() != Code::kDataLoss) return read;
    if (!read.ok()) MarkDamaged(c.file, next_from);
    a.from = next_from;
    next = read.ok() && end <= a.from + a.window.size;  // a damaged block there: the piece alone, below
  }
  if (next) {
    const uint64_t head = straddles ? next_from - begin : 0;
    if (head > 0) std::memcpy(target, w.bytes.data() + (begin - w.offset), head);
    std::memcpy(target + head, a.window.bytes.data() + (begin + head - a.from), c.length - head);
    std::swap(w, a.window);
    StartAhead(c.file);
    return true;
  }
  // Anywhere else: a window from this piece's first block, and reads ahead once the walk goes on
  // from it (the window starts within or right after the last one).
  const uint64_t from = AlignDown(begin, kBlockSize);
  const bool forward = w.size > 0 && from >= w.offset && from <= next_from;
  Status read = ReadWindow(c.file, from, &w, io_.get(), pool_.get(), &stats_);
  if (!read.ok()) {
    // A damaged block elsewhere in the window must not fail a piece that does not touch it, and
    // a damaged block of this piece is reported naming it: the piece is read on its own.
    if (read.code() != Code::kDataLoss) return read;
    MarkDamaged(c.file, from);
    return false;
  }
  // A window cut at the end of the wanted bytes (ReadOnly) may not hold a piece of an entry the
  // caller did not name: that piece is read on its own, never copied from what the window lacks.
  if (end > w.offset + w.size) return false;
  std::memcpy(target, w.bytes.data() + (begin - w.offset), c.length);
  if (forward) StartAhead(c.file);
  return true;
}

Status CheckpointReader::ReadPiece(size_t entry, const Layout& layout, void* out) {
  // The lists are members, cleared per piece: a piece of a small entry is cut from dozens of
  // chunks, and growing fresh lists for each of a hundred thousand pieces cost more than planning.
  std::vector<CopyRequest>& copies = piece_copies_;
  std::vector<CopyRequest>& direct = piece_direct_;
  copies.clear();
  direct.clear();
  PlanPieceCopy(manifest_, *index_, entry, layout, 0, &copies);
  auto* target = static_cast<unsigned char*>(out);
  const std::string& name = manifest_.entries[entry].name;
  for (const CopyRequest& c : copies) {
    if (!file_checked_[c.file]) SC_RETURN_IF_ERROR(CheckFile(c.file).WithContext("entry '" + name + "'"));
  }
  // Small copies (a piece of a small entry, cut from the chunks of several files) come from the
  // windows; anything wider goes through one plan of its own.
  for (const CopyRequest& c : copies) {
    Result<bool> served = CopyFromWindows(c, target + c.target_offset);
    if (!served.ok()) return served.status().WithContext(name);
    if (!*served) direct.push_back(c);
  }
  if (direct.empty()) return Status::Ok();
  return Run(direct, ReadTargets{{target}, {name}, {}});
}

Result<std::string> CheckpointReader::ReadBlob(const BlobRecord& blob) {
  std::string bytes(blob.bytes, '\0');
  const std::string label = "blob " + blob.name;
  Status read = CheckFile(blob.file);
  if (read.ok()) {
    read = Run({CopyRequest{blob.file, blob.offset, blob.bytes, 0, 0}},
               ReadTargets{{reinterpret_cast<unsigned char*>(bytes.data())}, {label}, {}});
  }
  if (!read.ok()) return read.WithContext("value '" + blob.name + "'");
  if (dcp_) {
    Result<std::string> value = DcpByteItemValue(bytes, blob.name);
    if (value.ok()) return value;
  }
  return bytes;
}

}  // namespace shardckpt
