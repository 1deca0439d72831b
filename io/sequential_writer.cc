#include "shardckpt/io/sequential_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "shardckpt/io/checksum.h"

namespace shardckpt {

SequentialWriter::~SequentialWriter() { io_->Drain().IgnoreError(); }

Status SequentialWriter::Open(const std::string& path) {
  SC_ASSIGN_OR_RETURN(file_, io_->Open(path, OpenMode::kCreate));
  return Status::Ok();
}

Status SequentialWriter::ReapOne() {
  SC_ASSIGN_OR_RETURN(uint64_t tag, io_->Reap());
  if (tag != kInPlaceTag) busy_[tag] = false;
  return Status::Ok();
}

Status SequentialWriter::ReapWhileFull() {
  while (io_->in_flight() >= io_->queue_depth()) SC_RETURN_IF_ERROR(ReapOne());
  return Status::Ok();
}

Status SequentialWriter::FlushStaged() {
  if (fill_ == 0) return Status::Ok();
  AlignedBuffer& buffer = pool_->at(current_);
  const size_t length = AlignUp(fill_, kBlockSize);
  std::memset(buffer.data() + fill_, 0, length - fill_);
  if (before_write_) SC_RETURN_IF_ERROR(before_write_(current_, buffer.data(), length));
  SC_RETURN_IF_ERROR(ReapWhileFull());
  const uint64_t offset = position_ - fill_;
  SC_RETURN_IF_ERROR(io_->Submit(file_.get(), IoOp{IoKind::kWrite, offset, buffer.data(), length}, current_));
  busy_[current_] = true;
  position_ = offset + length;
  current_ = (current_ + 1) % pool_->count();
  fill_ = 0;
  capacity_ = std::min(2 * capacity_, pool_->buffer_bytes());
  // The next buffer is filled only once its last write has completed.
  while (busy_[current_]) SC_RETURN_IF_ERROR(ReapOne());
  return Status::Ok();
}

Status SequentialWriter::Advance(size_t bytes) {
  fill_ += bytes;
  position_ += bytes;
  return fill_ == capacity_ ? FlushStaged() : Status::Ok();
}

Status SequentialWriter::Stage(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, room_bytes());
    std::memcpy(room(), p, n);
    p += n;
    bytes -= n;
    SC_RETURN_IF_ERROR(Advance(n));
  }
  return Status::Ok();
}

Status SequentialWriter::WriteInPlace(const void* data, uint64_t offset, size_t length) {
  SC_RETURN_IF_ERROR(ReapWhileFull());
  return io_->Submit(file_.get(), IoOp{IoKind::kWrite, offset, const_cast<void*>(data), length}, kInPlaceTag);
}

Status SequentialWriter::Finish(std::optional<uint64_t> exact_size) {
  SC_RETURN_IF_ERROR(FlushStaged());
  SC_RETURN_IF_ERROR(io_->Drain());
  if (exact_size && ::ftruncate(file_->fd(), static_cast<off_t>(*exact_size)) != 0) {
    return ErrnoStatus(errno, "truncate " + file_->path());
  }
  SC_RETURN_IF_ERROR(io_->Sync(file_.get()));
  file_.reset();
  return Status::Ok();
}

}  // namespace shardckpt
