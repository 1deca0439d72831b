#include "shardckpt/engine/core/extent_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "shardckpt/engine/model/name_list.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/read_ring.h"

namespace shardckpt {
namespace {

using PageKey = std::pair<uint32_t, uint64_t>;  // (file, table page)

// Data files open at once: a load of a checkpoint saved by thousands of ranks, on a few ranks,
// reads from every file, and one descriptor per file met the default `ulimit -n` (1024) there.
constexpr size_t kMaxOpenFiles = 64;

// The data files being read, opened on first use; Close() only once no read of them is in flight.
// Each is checked against the manifest's size on its first opening (missing, truncated): here,
// by the rank that reads it, rather than every file on one rank before the reads (a load of a
// checkpoint of thousands of files had rank 0 stat each in turn while the others waited; on a
// parallel file system a stat that asks a file's size is a round trip to its servers).
class OpenFiles {
 public:
  OpenFiles(IoEngine* io, const std::string& dir, const Manifest& manifest)
      : io_(io), dir_(dir), manifest_(manifest), checked_(manifest.files.size(), false) {}
  bool Has(uint32_t file) const { return files_.count(file) > 0; }
  bool Full() const { return files_.size() >= kMaxOpenFiles; }
  Result<File*> Get(uint32_t file) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second.get();
    const std::string path = JoinPath(dir_, manifest_.files[file].name);
    if (!checked_[file]) {
      const Status size = CheckDataFile(manifest_.files[file], FileSize(path));
      if (!size.ok()) return size.WithContext(dir_);  // as CheckDataFilesIn says it
      checked_[file] = true;
    }
    SC_ASSIGN_OR_RETURN(std::unique_ptr<File> opened, io_->Open(path, OpenMode::kRead));
    return (files_[file] = std::move(opened)).get();
  }
  void CloseAll() { files_.clear(); }

 private:
  IoEngine* io_;
  const std::string& dir_;
  const Manifest& manifest_;
  std::map<uint32_t, std::unique_ptr<File>> files_;
  std::vector<bool> checked_;  // by file: its size was compared with the manifest's
};

// Verified and scattered together, well inside a core's L2 (1 MiB on the benchmark machines).
constexpr uint64_t kScatterWindow = 256u << 10;

// Reads `ops` with the engine's queue kept full; every op has its own buffer already.
// On a failure the reads still in flight are drained before returning: their buffers and files
// are the caller's, freed as it returns.
Status RunAll(IoEngine* io, const std::vector<std::pair<File*, IoOp>>& ops) {
  auto failed = [io](Status status) {
    io->Drain().IgnoreError();
    return status;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    while (io->in_flight() >= io->queue_depth()) {
      Status reaped = io->Reap().status();
      if (!reaped.ok()) return failed(reaped);
    }
    Status submitted = io->Submit(ops[i].first, ops[i].second, i);
    if (!submitted.ok()) return failed(submitted);
  }
  return io->Drain();
}

// Adds the targets `extent`'s copies fill from the file bytes [begin, end) to `names`.
void AddTargetsIn(const ReadPlan& plan, const ReadExtent& extent, uint64_t begin, uint64_t end,
                  const ReadTargets& targets, std::set<std::string>* names) {
  for (size_t k = extent.first_copy; k < extent.first_copy + extent.copy_count; ++k) {
    const ScatterCopy& c = plan.copies[k];
    const uint64_t from = extent.offset + c.extent_offset;
    if (from < end && from + c.length > begin) names->emplace(targets.names[c.target]);
  }
}

// What a damaged block holds, for its message: every entry and value the manifest places in it
// (a checksum cannot tell which of them holds the damage, and a consolidation that named only the
// one it was reading sent its user back to exclude them one run at a time), those this read
// fills first; where the manifest places none, the targets this read fills, or "padding". At
// most kBlockNamesShown: a block of 1-byte values holds 4096 of them (`verify` lists every one).
std::string HeldInBlock(const Manifest& m, const ReadPlan& plan, const ReadExtent& extent, uint64_t block_begin,
                        const ReadTargets& targets) {
  std::set<std::string> read;
  const uint64_t begin = extent.offset + block_begin;
  AddTargetsIn(plan, extent, begin, begin + kBlockSize, targets, &read);
  auto in_block = [&](uint32_t file, uint64_t offset, uint64_t bytes) {
    return file == extent.file && bytes > 0 && offset < begin + kBlockSize && offset + bytes > begin;
  };
  std::vector<std::string> names;
  std::set<std::string_view> named;
  auto add = [&](const std::string& name) {
    if (named.insert(name).second) names.push_back(name);
  };
  for (const EntryRecord& e : m.entries) {
    if (std::any_of(e.chunks.begin(), e.chunks.end(), [&](const ChunkRecord& c) { return in_block(c.file, c.offset, c.bytes); })) {
      add(e.name);
    }
  }
  for (const BlobRecord& b : m.blobs) {
    if (in_block(b.file, b.offset, b.bytes)) add(b.name);
  }
  if (names.empty()) names.assign(read.begin(), read.end());
  std::stable_partition(names.begin(), names.end(), [&](const std::string& n) { return read.count(n) != 0; });
  constexpr size_t kBlockNamesShown = 100;
  return names.empty() ? "padding" : NameList(names, {}, kBlockNamesShown);
}

// What a damaged checksum-table page leaves unverifiable: the targets of every extent of this
// read in the blocks the page sums.
std::string TargetsSummedBy(const ReadPlan& plan, const PageKey& page, const ReadTargets& targets) {
  const uint64_t begin = page.second * kSumsPerTablePage * kBlockSize, end = begin + kSumsPerTablePage * kBlockSize;
  std::set<std::string> names;
  for (const ReadExtent& e : plan.extents) {
    if (e.file == page.first && e.offset < end && e.offset + e.length > begin) AddTargetsIn(plan, e, begin, end, targets, &names);
  }
  // A page sums 2 MiB of blocks: thousands of small tensors, listed twenty and a count.
  return names.empty() ? "padding" : NameList(std::vector<std::string>(names.begin(), names.end()));
}

// An extent that is exactly one copy into host memory can be read straight into the target,
// skipping the staging copy: the whole extent lands in the tensor, so its blocks are verified
// there. O_DIRECT files need the target address 4096-aligned as well.
unsigned char* InPlaceTarget(const ReadPlan& plan, const ReadExtent& e, const ReadTargets& targets, const File& file) {
  if (e.copy_count != 1) return nullptr;
  const ScatterCopy& c = plan.copies[e.first_copy];
  if (c.extent_offset != 0 || c.length != e.length) return nullptr;
  if (!targets.copier.empty() && targets.copier[c.target] != nullptr) return nullptr;
  unsigned char* at = targets.base[c.target] + c.target_offset;
  if (file.direct() && reinterpret_cast<uintptr_t>(at) % kDirectIoAlignment != 0) return nullptr;
  return at;
}

Status ReadTail(const std::string& dir, const FileRecord& f, const ReadExtent& e, std::vector<unsigned char>* out) {
  out->assign(e.length, 0);
  if (e.offset >= f.size) return Status::Ok();
  const std::string path = JoinPath(dir, f.name);
  SC_ASSIGN_OR_RETURN(const int fd, OpenFileNotFifo(path, O_RDONLY));
  Status read = ReadFullyAt(fd, out->data(), f.size - e.offset, e.offset, path);
  ::close(fd);
  return read;
}

}  // namespace

Status ExecuteReadPlan(IoEngine* io, BufferPool* pool, const std::string& dir,
                       const Manifest& manifest, const ReadPlan& plan, const ReadTargets& targets,
                       bool verify, ReadStats* stats, const FileInMemory& in_memory, const SharedBlocks& shared) {
  // Manifests are validated (every extent and table page lies inside its file), but a read out
  // of bounds in memory is worse than a failed one: anything outside is read from the file.
  auto from_memory = [&](uint32_t file, uint64_t offset, uint64_t length) {
    return file == in_memory.file && in_memory.data != nullptr && offset <= in_memory.bytes &&
           length <= in_memory.bytes - offset && (!in_memory.arrived || in_memory.arrived(offset, length));
  };
  OpenFiles files(io, dir, manifest);
  // Level 1: the checksum-table pages covering the blocks we read, verified against the manifest.
  std::map<PageKey, const uint64_t*> sums;
  AlignedBuffer pages;
  if (verify) {
    std::set<PageKey> needed;
    for (const ReadExtent& e : plan.extents) {
      if (!manifest.files[e.file].checksums) continue;
      uint64_t first = e.offset / kBlockSize, last = (e.offset + e.length) / kBlockSize - 1;
      for (uint64_t p = first / kSumsPerTablePage; p <= last / kSumsPerTablePage; ++p) needed.insert({e.file, p});
    }
    auto page_offset = [&](const PageKey& key) { return manifest.files[key.first].table_offset + key.second * kBlockSize; };
    // Decided once per page: the buffer below is sized by it, and the read ahead may fail between
    // two askings.
    std::vector<bool> page_in_memory;
    page_in_memory.reserve(needed.size());
    for (const PageKey& key : needed) page_in_memory.push_back(from_memory(key.first, page_offset(key), kBlockSize));
    const size_t to_read = std::count(page_in_memory.begin(), page_in_memory.end(), false);
    if (to_read > 0) {
      SC_ASSIGN_OR_RETURN(pages, AlignedBuffer::Allocate(to_read * kBlockSize));
    }
    std::vector<std::pair<File*, IoOp>> ops;
    size_t pages_read = 0;
    size_t page = 0;
    for (const PageKey& key : needed) {  // in file order: each file's pages, then the next file's
      if (page_in_memory[page++]) {
        sums[key] = reinterpret_cast<const uint64_t*>(in_memory.data + page_offset(key));
        continue;
      }
      if (!files.Has(key.first) && files.Full()) {
        SC_RETURN_IF_ERROR(RunAll(io, ops));
        ops.clear();
        files.CloseAll();
      }
      unsigned char* at = pages.data() + pages_read++ * kBlockSize;
      SC_ASSIGN_OR_RETURN(File * file, files.Get(key.first));
      ops.push_back({file, IoOp{IoKind::kRead, page_offset(key), at, kBlockSize}});
      sums[key] = reinterpret_cast<const uint64_t*>(at);
    }
    SC_RETURN_IF_ERROR(RunAll(io, ops));
    stats->table_bytes_read += pages_read * kBlockSize;
    for (const auto& [key, table] : sums) {
      const FileRecord& f = manifest.files[key.first];
      if (Checksum64(table, kBlockSize) != f.table_page_sums[key.second]) {
        return DataLoss(JoinPath(dir, f.name) + ": checksum table page " + std::to_string(key.second) +
                        " (file offset " + std::to_string(f.table_offset + key.second * kBlockSize) +
                        ") does not match the manifest: the file is corrupt, and the blocks it sums cannot be "
                        "verified (they hold " + TargetsSummedBy(plan, key, targets) + ")");
      }
    }
  }
  // Level 2: the data, through the read ring (io/read_ring.h); in-place extents land in the target.
  std::vector<bool> read_in_place(plan.extents.size(), false);
  auto verify_blocks = [&](const ReadExtent& e, const unsigned char* data, uint64_t from, uint64_t to) -> Status {
    for (uint64_t at = from; at < to; at += kBlockSize) {
      uint64_t block = (e.offset + at) / kBlockSize;
      if (shared.VerifiedElsewhere(e.file, block)) {
        stats->blocks_verified_elsewhere++;
        continue;
      }
      stats->blocks_verified++;
      uint64_t expected = sums[{e.file, block / kSumsPerTablePage}][block % kSumsPerTablePage];
      if (Checksum64(data + at, kBlockSize) != expected) {
        return DataLoss(JoinPath(dir, manifest.files[e.file].name) + ": checksum mismatch in the block at offset " +
                        std::to_string(e.offset + at) + " holding " + HeldInBlock(manifest, plan, e, at, targets));
      }
    }
    return Status::Ok();
  };
  const bool any_device_target =
      std::any_of(targets.copier.begin(), targets.copier.end(), [](const DeviceCopier* c) { return c != nullptr; });
  std::vector<size_t> running;  // WindowedScatter's copies that go on past its window
  // One pass over the bytes: each window of an extent is verified and then scattered while it is
  // still in the CPU's cache. An extent (8 MiB) is larger than the cache, so verifying all of it
  // before scattering read it from memory twice. Copies must come in extent order (CoalesceReads
  // makes them so); a copy across windows is copied a window's part at a time.
  auto windowed_scatter = [&](const ReadExtent& e, const unsigned char* data) -> Status {
    running.clear();
    size_t next = e.first_copy;
    const size_t end = e.first_copy + e.copy_count;
    for (uint64_t window = 0; window < e.length; window += kScatterWindow) {
      const uint64_t window_end = std::min<uint64_t>(e.length, window + kScatterWindow);
      SC_RETURN_IF_ERROR(verify_blocks(e, data, window, window_end));
      while (next < end && plan.copies[next].extent_offset < window_end) running.push_back(next++);
      size_t kept = 0;
      for (size_t k : running) {
        const ScatterCopy& c = plan.copies[k];
        const uint64_t from = std::max(c.extent_offset, window), to = std::min(c.extent_offset + c.length, window_end);
        if (to > from) std::memcpy(targets.base[c.target] + c.target_offset + (from - c.extent_offset), data + from, to - from);
        if (c.extent_offset + c.length > window_end) running[kept++] = k;
      }
      running.resize(kept);
    }
    return Status::Ok();
  };
  auto complete = [&](size_t extent, const unsigned char* data) -> Status {
    const ReadExtent& e = plan.extents[extent];
    const bool verifies = verify && manifest.files[e.file].checksums;
    const auto copies = plan.copies.begin() + static_cast<std::ptrdiff_t>(e.first_copy);
    if (verifies && !read_in_place[extent] && !any_device_target &&
        std::is_sorted(copies, copies + static_cast<std::ptrdiff_t>(e.copy_count),
                       [](const ScatterCopy& a, const ScatterCopy& b) { return a.extent_offset < b.extent_offset; })) {
      return windowed_scatter(e, data);
    }
    if (verifies) SC_RETURN_IF_ERROR(verify_blocks(e, data, 0, e.length));
    if (read_in_place[extent]) {
      stats->bytes_read_in_place += e.length;
      return Status::Ok();
    }
    DeviceCopier* device_copies = nullptr;
    for (size_t k = e.first_copy; k < e.first_copy + e.copy_count; ++k) {
      const ScatterCopy& c = plan.copies[k];
      DeviceCopier* copier = targets.copier.empty() ? nullptr : targets.copier[c.target];
      if (copier == nullptr) {
        std::memcpy(targets.base[c.target] + c.target_offset, data + c.extent_offset, c.length);
        continue;
      }
      if (device_copies != nullptr && device_copies != copier) SC_RETURN_IF_ERROR(device_copies->Synchronize());
      Status copied = copier->CopyToDeviceAsync(targets.base[c.target] + c.target_offset, data + c.extent_offset, c.length);
      if (!copied.ok()) return copied.WithContext(std::string(targets.names[c.target]));  // the name only on failure
      device_copies = copier;
    }
    // The buffer is read again by the next extent; its host-to-device copies must have landed.
    if (device_copies != nullptr) SC_RETURN_IF_ERROR(device_copies->Synchronize());
    return Status::Ok();
  };
  ReadRing ring(io, pool, complete);
  // A failure met while issuing reads stops the ring; a failure of a read issued before it (a
  // checksum mismatch found on completion) happened first and is the one reported.
  auto stop = [&ring](Status failure) {
    Status earlier = ring.Finish();
    return earlier.ok() ? failure : earlier;
  };
  std::vector<unsigned char> tail;
  for (size_t i = 0; i < plan.extents.size(); ++i) {
    const ReadExtent& e = plan.extents[i];
    const FileRecord& f = manifest.files[e.file];
    if (!f.checksums && e.offset + e.length > f.size) {
      // A file of another format (DCP) ends off the 4096-byte grid: its last extent is read
      // buffered up to the end, the rest of the block zero (no wanted byte lies there).
      Status read = ReadTail(dir, f, e, &tail);
      if (read.ok()) read = complete(i, tail.data());
      if (!read.ok()) return stop(read);
      stats->data_bytes_read += f.size - std::min(f.size, e.offset);
      stats->extents++;
      continue;
    }
    // Once its reads are in (the extents before it were taken meanwhile); where one failed, the
    // extent is read from the file below.
    if (from_memory(e.file, e.offset, e.length)) {  // counted as read by the read ahead
      Status copied = complete(i, in_memory.data + e.offset);
      if (!copied.ok()) return stop(copied);
      stats->extents++;
      continue;
    }
    if (!files.Has(e.file) && files.Full()) {  // the ring's reads of them land first
      SC_RETURN_IF_ERROR(ring.Finish());
      files.CloseAll();
    }
    Result<File*> file = files.Get(e.file);
    if (!file.ok()) return stop(file.status());
    unsigned char* into = InPlaceTarget(plan, e, targets, **file);
    read_in_place[i] = into != nullptr;
    if (!ring.Read(*file, e.offset, e.length, i, into).ok()) break;
    stats->data_bytes_read += e.length;
    stats->extents++;
  }
  return ring.Finish();
}

}  // namespace shardckpt
