#include "shardckpt/engine/core/shard_writer.h"

#include <algorithm>
#include <cstring>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {

ShardFileWriter::~ShardFileWriter() { io_->Drain().IgnoreError(); }

Status ShardFileWriter::Open(const std::string& dir, const std::string& name) {
  name_ = name;
  SC_ASSIGN_OR_RETURN(file_, io_->Open(JoinPath(dir, name), OpenMode::kCreate));
  return Status::Ok();
}

Status ShardFileWriter::HandleCompletion(uint64_t tag) {
  if (tag != kDirectTag) busy_[tag] = false;
  return Status::Ok();
}

Status ShardFileWriter::WaitForBuffer(size_t index) {
  while (busy_[index]) {
    SC_ASSIGN_OR_RETURN(uint64_t tag, io_->Reap());
    SC_RETURN_IF_ERROR(HandleCompletion(tag));
  }
  return Status::Ok();
}

Status ShardFileWriter::ReapWhileFull() {
  while (io_->in_flight() >= io_->queue_depth()) {
    SC_ASSIGN_OR_RETURN(uint64_t tag, io_->Reap());
    SC_RETURN_IF_ERROR(HandleCompletion(tag));
  }
  return Status::Ok();
}

Status ShardFileWriter::FlushCurrent() {
  if (fill_ == 0) return Status::Ok();
  AlignedBuffer& buffer = pool_->at(current_);
  // Pieces from several devices may share the buffer: every copy into it must have landed.
  for (DeviceCopier* copier : copying_[current_]) {
    SC_RETURN_IF_ERROR(copier->WaitSlot(current_).WithContext("writing " + name_));
  }
  copying_[current_].clear();
  size_t length = AlignUp(fill_, kBlockSize);
  std::memset(buffer.data() + fill_, 0, length - fill_);
  if (checksumming_) {
    size_t first = sums_.size();
    sums_.resize(first + length / kBlockSize);
    ChecksumBlocks(buffer.data(), length, sums_.data() + first);
  }
  SC_RETURN_IF_ERROR(ReapWhileFull());
  uint64_t offset = position_ - fill_;
  SC_RETURN_IF_ERROR(io_->Submit(file_.get(), IoOp{IoKind::kWrite, offset, buffer.data(), length}, current_));
  busy_[current_] = true;
  position_ = offset + length;  // a partial buffer is only flushed at a block boundary
  current_ = (current_ + 1) % pool_->count();
  fill_ = 0;
  return WaitForBuffer(current_);
}

Status ShardFileWriter::CopyIn(const unsigned char* data, size_t bytes) {
  while (bytes > 0) {
    AlignedBuffer& buffer = pool_->at(current_);
    size_t n = std::min(bytes, buffer.size() - fill_);
    std::memcpy(buffer.data() + fill_, data, n);
    fill_ += n;
    position_ += n;
    data += n;
    bytes -= n;
    if (fill_ == buffer.size()) SC_RETURN_IF_ERROR(FlushCurrent());
  }
  return Status::Ok();
}

Status ShardFileWriter::PadToBlock() {
  uint64_t pad = AlignUp(position_, kBlockSize) - position_;
  if (pad == 0) return Status::Ok();
  static const unsigned char kZeros[kBlockSize] = {};
  return CopyIn(kZeros, pad);
}

Status ShardFileWriter::WriteInPlace(const unsigned char* data, uint64_t offset, size_t length) {
  SC_RETURN_IF_ERROR(ReapWhileFull());
  return io_->Submit(file_.get(), IoOp{IoKind::kWrite, offset, const_cast<unsigned char*>(data), length}, kDirectTag);
}

Status ShardFileWriter::FlushRun() {
  if (run_bytes_ > 0) SC_RETURN_IF_ERROR(WriteInPlace(run_, run_offset_, run_bytes_));
  run_bytes_ = 0;
  return Status::Ok();
}

// `bytes` of padded memory at an aligned position_: checksummed now (so the table stays in file
// order), written when the run reaches a buffer's size or stops being adjacent.
Status ShardFileWriter::AppendInPlace(const unsigned char* data, size_t bytes) {
  SC_RETURN_IF_ERROR(FlushCurrent());
  const size_t length = AlignUp(bytes, kBlockSize);
  size_t first = sums_.size();
  sums_.resize(first + length / kBlockSize);
  ChecksumBlocks(data, length, sums_.data() + first);
  if (run_bytes_ > 0 && (run_ + run_bytes_ != data || run_offset_ + run_bytes_ != position_)) {
    SC_RETURN_IF_ERROR(FlushRun());
  }
  if (run_bytes_ == 0) {
    run_ = data;
    run_offset_ = position_;
  }
  run_bytes_ += length;
  position_ += length;
  const size_t chunk = pool_->buffer_bytes();
  while (run_bytes_ >= chunk) {
    SC_RETURN_IF_ERROR(WriteInPlace(run_, run_offset_, chunk));
    run_ += chunk;
    run_offset_ += chunk;
    run_bytes_ -= chunk;
  }
  return Status::Ok();
}

Result<uint64_t> ShardFileWriter::Append(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t chunk = pool_->buffer_bytes();
  // Without O_DIRECT (memory-backed file systems) any address may be written from directly.
  bool aligned = reinterpret_cast<uintptr_t>(p) % kDirectIoAlignment == 0 || !file_->direct();
  if (padded_ && aligned) {  // empty pieces too: they must not break a run
    SC_RETURN_IF_ERROR(PadToBlock());
    const uint64_t offset = position_;
    SC_RETURN_IF_ERROR(AppendInPlace(p, bytes));
    return offset;
  }
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadToBlock());
  const uint64_t offset = position_;
  if (!always_stage_ && aligned && bytes >= chunk) {
    SC_RETURN_IF_ERROR(FlushCurrent());  // at a block boundary: position_ is aligned now
    size_t direct = AlignDown(bytes, kBlockSize);
    for (size_t done = 0; done < direct; done += chunk) {
      size_t length = std::min(chunk, direct - done);
      size_t first = sums_.size();
      sums_.resize(first + length / kBlockSize);
      ChecksumBlocks(p + done, length, sums_.data() + first);
      SC_RETURN_IF_ERROR(WriteInPlace(p + done, position_, length));
      position_ += length;
    }
    p += direct;
    bytes -= direct;
  }
  SC_RETURN_IF_ERROR(CopyIn(p, bytes));
  return offset;
}

Result<uint64_t> ShardFileWriter::AppendFromDevice(const void* device_data, size_t bytes, DeviceCopier* copier) {
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadToBlock());
  const uint64_t offset = position_;
  const auto* p = static_cast<const unsigned char*>(device_data);
  while (bytes > 0) {
    AlignedBuffer& buffer = pool_->at(current_);
    size_t n = std::min(bytes, buffer.size() - fill_);
    SC_RETURN_IF_ERROR(copier->CopyToHostAsync(buffer.data() + fill_, p, n, current_));
    std::vector<DeviceCopier*>& copiers = copying_[current_];
    if (std::find(copiers.begin(), copiers.end(), copier) == copiers.end()) copiers.push_back(copier);
    fill_ += n;
    position_ += n;
    p += n;
    bytes -= n;
    if (fill_ == buffer.size()) SC_RETURN_IF_ERROR(FlushCurrent());
  }
  return offset;
}

Result<FileRecord> ShardFileWriter::Finish() {
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadToBlock());
  SC_RETURN_IF_ERROR(FlushCurrent());
  FileRecord record;
  record.name = name_;
  record.table_offset = position_;
  // The table: one u64 per data block, padded to whole pages, each page checksummed for the
  // manifest.
  const uint64_t pages = TablePages(record.table_offset);
  std::vector<uint64_t> table(pages * kSumsPerTablePage, 0);
  std::copy(sums_.begin(), sums_.end(), table.begin());
  for (uint64_t page = 0; page < pages; ++page) {
    record.table_page_sums.push_back(Checksum64(table.data() + page * kSumsPerTablePage, kBlockSize));
  }
  checksumming_ = false;
  SC_RETURN_IF_ERROR(CopyIn(reinterpret_cast<const unsigned char*>(table.data()), table.size() * 8));
  SC_RETURN_IF_ERROR(FlushCurrent());
  SC_RETURN_IF_ERROR(io_->Drain());
  record.size = position_;
  SC_RETURN_IF_ERROR(io_->Sync(file_.get()));
  file_.reset();
  return record;
}

}  // namespace shardckpt
