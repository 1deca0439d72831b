#include "shardckpt/engine/core/read_ahead.h"

#include <algorithm>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

// Reads of 8 MiB (the benchmarks' fio block), all submitted at once: at most this many.
constexpr size_t kMaxReads = 32;
constexpr uint64_t kReadBytes = 8u << 20;

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
  const uint64_t read_bytes =
      std::max<uint64_t>(kReadBytes, AlignUp((*bytes + kMaxReads - 1) / kMaxReads, kDirectIoAlignment));
  const size_t reads = static_cast<size_t>((*bytes + read_bytes - 1) / read_bytes);
  IoOptions options = io_options;
  options.queue_depth = std::max<size_t>(reads, 1);
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
  for (size_t i = 0; i < reads && ahead->failure_.ok(); ++i) {
    const uint64_t offset = i * read_bytes;
    const IoOp op{IoKind::kRead, offset, buffer + offset,
                  static_cast<size_t>(std::min<uint64_t>(read_bytes, *bytes - offset))};
    ahead->failure_ = ahead->io_->Submit(ahead->file_.get(), op, i);
  }
  return ahead;
}

FileReadAhead::~FileReadAhead() {
  // The buffer must outlive the reads into it.
  if (io_ != nullptr) io_->Drain().IgnoreError();
}

const unsigned char* FileReadAhead::Wait() {
  if (!waited_) {
    Status drained = io_->Drain();
    if (failure_.ok()) failure_ = drained;
    waited_ = true;
    if (!failure_.ok()) SC_LOG(kDebug) << "read ahead of " << path_ << " dropped: " << failure_.ToString();
  }
  return failure_.ok() ? memory_.pool()->at(0).data() : nullptr;
}

}  // namespace shardckpt
