#include "shardckpt/engine/core/manifest_ahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <system_error>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/direct_io.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {

namespace {

// A training loop's metrics and metadata rarely change between saves; a few more fit.
constexpr uint64_t kHeadSlack = 512;

uint64_t WholeBlocks(uint64_t bytes) { return bytes / kDirectIoAlignment * kDirectIoAlignment; }

}  // namespace

uint64_t ManifestHeadRoom(size_t head_bytes) { return AlignUp(head_bytes + kHeadSlack, kDirectIoAlignment); }

size_t ManifestAheadStagingBytes(uint64_t head_room, size_t body_bytes) {
  // The seal, with the spaces that end the text on a block boundary, takes at most one block more.
  return AlignUp(head_room + body_bytes, kDirectIoAlignment) + kDirectIoAlignment;
}

ManifestAhead::ManifestAhead(std::string path, uint64_t head_room, std::string_view body, AlignedBuffer* staging)
    : path_(std::move(path)), head_room_(head_room), body_(body), staging_(staging) {
  if (head_room_ % kDirectIoAlignment != 0 || staging_ == nullptr) {
    status_ = Internal("manifest head room " + std::to_string(head_room_) + " is not whole blocks (a bug)");
    return;
  }
  try {
    thread_ = std::thread([this] { WriteBody(); });
  } catch (const std::system_error& e) {  // no thread to be had (a pids limit): the commit writes it all
    status_ = Internal(std::string("no thread to write ") + path_ + " early: " + e.what());
  }
}

ManifestAhead::~ManifestAhead() { Close(); }

void ManifestAhead::Close() {
  Wait().IgnoreError();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ManifestAhead::WriteBody() {
  status_ = Failpoint("commit.manifest_ahead", "write " + path_);
  if (!status_.ok()) return;
  // O_TRUNC, not O_EXCL: the temp folder is this save's own, and where the file system refuses
  // O_DIRECT the buffered retry finds the file the refused open created.
  Result<int> fd = OpenPreferDirect(path_, O_WRONLY | O_CREAT | O_TRUNC, /*prefer_direct=*/true, &direct_);
  if (!fd.ok()) {
    status_ = fd.status();
    return;
  }
  fd_ = *fd;
  if (!direct_) {  // page cache (tmpfs): any offset and memory will do, no staging
    status_ = WriteFullyAt(fd_, body_.data(), body_.size(), head_room_, path_);
    return;
  }
  Status room = EnsureAlignedBytes(staging_, ManifestAheadStagingBytes(head_room_, body_.size()));
  if (!room.ok()) {
    status_ = room.WithContext("write " + path_);
    return;
  }
  std::memcpy(staging_->data() + head_room_, body_.data(), body_.size());
  const uint64_t blocks = WholeBlocks(body_.size());
  if (blocks != 0) status_ = WriteFullyAt(fd_, staging_->data() + head_room_, blocks, head_room_, path_);
}

Status ManifestAhead::Wait() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

bool ManifestAhead::Fits(std::string_view head, std::string_view body) const {
  return head.size() == head_room_ && body.data() == body_.data() && body.size() == body_.size();
}

Status ManifestAhead::Complete(std::string_view head, std::string_view body, std::string_view seal) {
  Status status = Wait();
  if (status.ok() && fd_ < 0) status = Internal(path_ + " was closed before its commit (a bug)");
  if (status.ok() && !Fits(head, body)) status = Internal("the manifest text is not the one written early to " + path_ + " (a bug)");
  if (status.ok()) status = Failpoint("commit.manifest.write", "write " + path_);
  if (status.ok()) status = direct_ ? CompleteDirect(head, seal) : CompleteBuffered(head, seal);
  if (status.ok()) status = Failpoint("commit.manifest.fsync", "fsync " + path_);
  if (status.ok() && ::fdatasync(fd_) != 0) status = ErrnoStatus(errno, "fsync " + path_);
  // Closed now, not when the save returns: a failed commit removes the folder, which an open file
  // would keep on NFS (as a .nfs file), and a process forked meanwhile would hold it.
  Close();
  return status;
}

Status ManifestAhead::CompleteBuffered(std::string_view head, std::string_view seal) {
  SC_RETURN_IF_ERROR(WriteFullyAt(fd_, head.data(), head.size(), 0, path_));
  return WriteFullyAt(fd_, seal.data(), seal.size(), head_room_ + body_.size(), path_);
}

Status ManifestAhead::CompleteDirect(std::string_view head, std::string_view seal) {
  const uint64_t size = head_room_ + body_.size() + seal.size();
  const uint64_t padded = AlignUp(size, kDirectIoAlignment);
  if (staging_->size() < padded) return Internal("the seal of " + path_ + " does not fit its staging (a bug)");
  unsigned char* text = staging_->data();
  std::memcpy(text, head.data(), head.size());
  std::memcpy(text + head_room_ + body_.size(), seal.data(), seal.size());
  std::memset(text + size, 0, padded - size);
  // What the early write left: the head's blocks, and from the body's last partial block on.
  const uint64_t rest = head_room_ + WholeBlocks(body_.size());
  SC_RETURN_IF_ERROR(WriteFullyAt(fd_, text, head_room_, 0, path_));
  SC_RETURN_IF_ERROR(WriteFullyAt(fd_, text + rest, padded - rest, rest, path_));
  if (padded != size && ::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, "truncate " + path_ + " to " + std::to_string(size) + " bytes");
  }
  return Status::Ok();
}

}  // namespace shardckpt
