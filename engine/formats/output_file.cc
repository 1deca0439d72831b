#include "shardckpt/engine/formats/output_file.h"

#include "shardckpt/engine/formats/sha256_sidecar.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <memory>
#include <system_error>

#include "shardckpt/engine/formats/byte_text.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {
// Writes in flight while the next buffer fills: with two, a 1 GiB .pt export ran at 0.46-0.60x
// fio's read+write on this VM's disk, with eight 0.61-0.79x. At least two in any case: a buffer
// is hashed while the next fills, and refilled only after that one is submitted, whose hook
// waits for the hash. Fewer for a small file: each buffer is fresh memory that a short-lived tool
// faults in, and a 56 MB export staged through eight took 0.22-1.08 s on this VM, where fresh
// pages are sometimes slow to come, against 0.22-0.25 s through less.
constexpr size_t kMaxBuffers = 8, kMinBuffers = 2;
constexpr size_t kBufferBytes = 4u << 20;
constexpr uint64_t kBytesPerBuffer = 32u << 20;  // of the file, for each buffer
}  // namespace

size_t OutputFile::BuffersFor(uint64_t expected_bytes) {
  if (expected_bytes == 0) return kMaxBuffers;
  return static_cast<size_t>(std::clamp<uint64_t>(expected_bytes / kBytesPerBuffer, kMinBuffers, kMaxBuffers));
}

Result<std::unique_ptr<OutputFile>> OutputFile::Create(const std::string& path, uint64_t expected_bytes) {
  std::unique_ptr<OutputFile> out(new OutputFile());
  out->path_ = path;
  out->temp_ = path + ".partial";
  const size_t buffers = BuffersFor(expected_bytes);
  IoOptions options;
  options.queue_depth = buffers;
  out->io_ = CreateIoEngine(options);
  SC_ASSIGN_OR_RETURN(out->pool_, BufferPool::Create(buffers, kBufferBytes,
                                                     AllocatorForReuse(expected_bytes, buffers * kBufferBytes)));
  out->sha_ = EVP_MD_CTX_new();
  EVP_DigestInit_ex(out->sha_, EVP_sha256(), nullptr);
  OutputFile* self = out.get();
  out->writer_ = std::make_unique<SequentialWriter>(
      out->io_.get(), out->pool_.get(),
      [self](size_t, const unsigned char* data, size_t length) { return self->HashBuffer(data, length); });
  SC_RETURN_IF_ERROR(out->writer_->Open(out->temp_));
  return out;
}

OutputFile::~OutputFile() {
  WaitForHash();  // it reads a staging buffer and the digest state
  if (writer_ != nullptr) writer_.reset();
  if (!published_) {  // not published: an abandoned export
    ::unlink(temp_.c_str());
    if (sidecar_prepared_) DiscardPreparedFile(path_ + ".sha256");
  }
  if (sha_ != nullptr) EVP_MD_CTX_free(sha_);
}

void OutputFile::WaitForHash() {
  if (hash_.valid()) hash_.get();
}

Status OutputFile::HashBuffer(const unsigned char* data, size_t length) {
  // The buffer holds file bytes [hashed_, hashed_ + length); only the last one is padded past
  // position_, which counts every byte staged so far.
  const size_t bytes = static_cast<size_t>(std::min<uint64_t>(length, position_ - hashed_));
  hashed_ += bytes;
  WaitForHash();  // digests go in file order
  try {
    hash_ = std::async(std::launch::async, [this, data, bytes] { EVP_DigestUpdate(sha_, data, bytes); });
  } catch (const std::system_error&) {  // no thread to be had (a pids limit): the same digest, here
    EVP_DigestUpdate(sha_, data, bytes);
  }
  return Status::Ok();
}

Status OutputFile::Write(const void* data, size_t bytes) {
  position_ += bytes;
  return writer_->Stage(data, bytes);
}

Status OutputFile::Finish() {
  if (writer_ == nullptr) return FailedPrecondition(path_ + ": finished already");
  Status finished = writer_->Finish(position_);
  WaitForHash();
  writer_.reset();  // the staging buffers and the ring go now: a finished file holds no memory
  pool_.reset();
  io_.reset();
  SC_RETURN_IF_ERROR(finished);
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_DigestFinal_ex(sha_, digest, &length);
  sha256_ = HexEncode(std::string_view(reinterpret_cast<const char*>(digest), length));
  return Status::Ok();
}

Status OutputFile::PrepareSidecar() {
  if (sha256_.empty()) return FailedPrecondition(path_ + ": published before it was finished");
  if (!sidecar_prepared_) {
    SC_RETURN_IF_ERROR(PrepareFileAtomic(path_ + ".sha256", SidecarText(path_, sha256_), "export.sha256"));
    sidecar_prepared_ = true;
  }
  return Status::Ok();
}

Status OutputFile::Publish() {
  // The new sidecar is written (under PATH.sha256.tmp) before anything is replaced: on a disk
  // too full for its few bytes the export fails with the previous file and its sidecar whole,
  // where it had replaced the file and then failed, leaving it without a sidecar.
  // The previous sidecar then goes before the rename: a crash between the rename and the new
  // sidecar left the new file beside the old digest, which then refused it (import,
  // sha256sum -c). Now a crash leaves one of the two files without a sidecar, never a mismatched
  // pair. A rename that fails (not a crash) puts the previous sidecar back: the previous file
  // whole.
  SC_RETURN_IF_ERROR(PrepareSidecar());
  const std::string sidecar = path_ + ".sha256";
  Result<std::string> previous_sidecar = ReadFileLimited(sidecar, 4096);
  if (::unlink(sidecar.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "remove the previous " + sidecar);
  if (Status renamed = Rename(temp_, path_); !renamed.ok()) {
    // (through PATH.sha256.tmp: the prepared sidecar is gone with it)
    if (previous_sidecar.ok()) WriteFileAtomic(sidecar, *previous_sidecar, "export.sha256_restore").IgnoreError();
    DiscardPreparedFile(sidecar);
    sidecar_prepared_ = false;
    return renamed;
  }
  published_ = true;
  sidecar_prepared_ = false;
  if (Status published = PublishPreparedFile(sidecar, "export.sha256"); !published.ok()) {
    // The new file without its digest would pass for a finished export: removed, said.
    DiscardPreparedFile(sidecar);
    RemoveOutputFile(path_);
    return Status(published.code(), published.message() + "; " + path_ + " is removed again: export again");
  }
  return Status::Ok();
}

Status OutputFile::Close() {
  SC_RETURN_IF_ERROR(Finish());
  return Publish();
}

Result<OutputLock> OutputLock::Acquire(const std::string& out) {
  const std::string name = BaseName(WithoutTrailingSlashes(out));
  const std::string path = JoinPath(DirName(WithoutTrailingSlashes(out)), "." + name + ".lock");
  // A holder removes the file as it lets go, so a lock won on a file already removed is no hold:
  // open again (a few times: each retry means another export just finished).
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) {
      // A folder this user may not write (an empty export folder made for them in a shared
      // one): the export goes on unheld, as before there were holds.
      LogOnce(LogLevel::kWarn, "output_lock_unwritable",
              "cannot create " + path + " (" + std::strerror(errno) + "): exports to " + out +
                  " are not held against another export to it");
      return OutputLock("", -1);
    }
    if (fd < 0) return ErrnoStatus(errno, "create the lock file of the output " + out);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return FailedPrecondition("another consolidate or export is writing " + out + " now (it holds " + path +
                                  "): wait for it to finish, or write to another path");
      }
      if (err == ENOLCK || err == EOPNOTSUPP || err == EINVAL) {
        LogOnce(LogLevel::kWarn, "output_lock",
                "no flock on the file system of " + out + ": two exports to one path at once are not refused");
        ::unlink(path.c_str());
        return OutputLock("", -1);
      }
      return ErrnoStatus(err, "lock " + path);
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      return OutputLock(path, fd);
    }
    ::close(fd);
  }
  return FailedPrecondition("other exports keep writing " + out + ": try again when they are done");
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the close: nobody holds a file that is still named
  ::close(fd_);
}

void RemoveOutputFile(const std::string& path) {
  ::unlink(path.c_str());
  ::unlink((path + ".sha256").c_str());
}

OutputSet::~OutputSet() {
  if (keep_) return;
  if (!created_dir_.empty()) {
    (void)RemoveTree(created_dir_);  // best effort: the export's own error is what the caller sees
    return;
  }
  for (const std::string& path : paths_) RemoveOutputFile(path);
}

}  // namespace shardckpt
