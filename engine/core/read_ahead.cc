#include "shardckpt/engine/core/read_ahead.h"

#include <algorithm>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

// The file is read in reads of at least this, at most kMaxReads of them, all submitted at once.
// Not the 8 MiB of a load's other reads: on the benchmark VM's disk a 27 MiB file read in 1 MiB
// reads completes in file order one read at a time, so the first blocks are there to verify and
// copy long before the last (8 MiB reads came back in four steps, the first after half the time).
constexpr size_t kMaxReads = 64;
constexpr uint64_t kReadBytes = 1u << 20;

// The file's tail read first, so that the checksum table (the last ceil(blocks / 512) pages of
// a file this engine wrote: one 8-byte sum per 4096-byte block) is in memory before the first
// data block the load verifies. A page more than that: slack, not needed by the arithmetic.
uint64_t TailBytes(uint64_t file_bytes) {
  return std::min(file_bytes, AlignUp(file_bytes / (kDirectIoAlignment / 8), kDirectIoAlignment) + kDirectIoAlignment);
}

}  // namespace

bool WorthReadingAhead(const ReadAheadHint& hint, uint64_t file_bytes, uint64_t max_bytes) {
  if (!hint.same_world || file_bytes == 0 || file_bytes > max_bytes) return false;
  if (hint.manifest_bytes < kReadAheadMinManifestBytes) return false;
  // Not a multiple: O_DIRECT cannot read its last block whole (not a file this engine wrote).
  if (file_bytes % kDirectIoAlignment != 0) return false;
  return file_bytes / kReadAheadBytesPerManifestByte <= hint.manifest_bytes;
}

std::unique_ptr<FileReadAhead> FileReadAhead::Start(const std::string& path, const ReadAheadHint& hint,
                                                    uint64_t max_bytes, const IoOptions& io_options, bool keep_memory) {
  Result<uint64_t> bytes = FileSize(path);
  if (!bytes.ok() || !WorthReadingAhead(hint, *bytes, max_bytes) || IsMemoryBacked(path)) return nullptr;
  std::unique_ptr<FileReadAhead> ahead(new FileReadAhead());
  ahead->path_ = path;
  ahead->bytes_ = *bytes;
  const uint64_t tail = TailBytes(*bytes), body = *bytes - tail;
  const uint64_t read_bytes = std::max<uint64_t>(kReadBytes, AlignUp((body + kMaxReads - 1) / kMaxReads, kDirectIoAlignment));
  ahead->reads_.push_back(Read{body, tail});
  for (uint64_t offset = 0; offset < body; offset += read_bytes) {
    ahead->reads_.push_back(Read{offset, std::min(read_bytes, body - offset)});
  }
  IoOptions options = io_options;
  options.queue_depth = ahead->reads_.size();
  ahead->io_ = CreateIoEngine(options);
  // The posix engine reads at submission: that would be the load's read, only earlier and in the
  // way of the manifest's decode.
  if (std::string(ahead->io_->name()) != "io_uring") {
    SC_LOG(kDebug) << "no read ahead of " << path << ": io_uring is not available";
    return nullptr;
  }
  Result<std::unique_ptr<File>> file = ahead->io_->Open(path, OpenMode::kRead);
  if (!file.ok() || !(*file)->direct()) {
    SC_LOG(kDebug) << "no read ahead of " << path << ": "
                   << (file.ok() ? "no O_DIRECT (a buffered read would not run in the background)" : file.status().ToString());
    return nullptr;
  }
  ahead->file_ = std::move(file).value();
  Result<StagingLease> memory = StagingLease::Acquire(1, static_cast<size_t>(*bytes), DefaultHostAllocator(), keep_memory,
                                                      1, StagingUse::kReadAhead);
  if (!memory.ok()) {
    SC_LOG(kDebug) << "no read ahead of " << path << ": " << memory.status().ToString();
    return nullptr;
  }
  ahead->memory_ = std::move(memory).value();
  unsigned char* buffer = ahead->memory_.pool()->at(0).data();
  for (size_t i = 0; i < ahead->reads_.size() && ahead->failure_.ok(); ++i) {
    const Read& read = ahead->reads_[i];
    ahead->failure_ = ahead->io_->Submit(ahead->file_.get(), IoOp{IoKind::kRead, read.offset, buffer + read.offset,
                                                                  static_cast<size_t>(read.length)}, i);
  }
  return ahead;
}

FileReadAhead::~FileReadAhead() {
  // The buffer must outlive the reads into it.
  if (io_ != nullptr) io_->Drain().IgnoreError();
}

bool FileReadAhead::WaitFor(uint64_t offset, uint64_t length) {
  if (offset > bytes_ || length > bytes_ - offset) return false;
  auto pending = [&] {
    for (const Read& read : reads_) {
      if (!read.done && read.offset < offset + length && offset < read.offset + read.length) return true;
    }
    return false;
  };
  while (failure_.ok() && pending()) {
    Result<uint64_t> tag = io_->Reap();
    if (!tag.ok()) {
      failure_ = tag.status();
      break;
    }
    reads_[*tag].done = true;
    bytes_completed_ += reads_[*tag].length;
  }
  if (!pending()) return true;  // every read of the range landed, before any failure
  if (!dropped_) {
    dropped_ = true;
    io_->Drain().IgnoreError();  // the reads still in flight land before anything reads the file again
    SC_LOG(kDebug) << "read ahead of " << path_ << " cut short: " << failure_.ToString();
  }
  return false;
}

}  // namespace shardckpt
