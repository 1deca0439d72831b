#include "shardckpt/engine/core/shard_writer.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

ShardFileWriter::ShardFileWriter(IoEngine* io, BufferPool* pool, bool always_stage, bool padded, size_t hash_helpers)
    : pool_(pool), always_stage_(always_stage), padded_(padded), hash_helpers_(hash_helpers), copying_(pool->count()),
      writer_(io, pool, [this](size_t buffer, const unsigned char* data, size_t length) {
        return BeforeWrite(buffer, data, length);
      }) {}

ShardFileWriter::~ShardFileWriter() {
  for (size_t buffer = 0; buffer < copying_.size(); ++buffer) {
    for (DeviceCopier* copier : copying_[buffer]) copier->WaitSlot(buffer).IgnoreError();
  }
}

Status ShardFileWriter::Open(const std::string& dir, const std::string& name) {
  name_ = name;
  return writer_.Open(JoinPath(dir, name));
}

size_t ShardFileWriter::DefaultHashHelpers() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 1 ? std::min<size_t>(cores - 1, 4) : 0;
}

// Memory written in place is never copied by the writer, so the sums are the only pass over it
// besides the kernel's: large runs are summed on helper threads while their writes go out, each
// into its own slots of the table, joined in Finish (or sooner when too many are running).
void ShardFileWriter::SumInPlace(const unsigned char* data, size_t length) {
  if (hash_helpers_ == 0 || length < kBackgroundSumBytes) return Sum(data, length);
  while (background_.size() >= hash_helpers_) JoinOldestSum();
  std::future<std::vector<uint64_t>> sums;
  try {
    sums = std::async(std::launch::async, [data, length] {
      std::vector<uint64_t> out(length / kBlockSize);
      ChecksumBlocks(data, length, out.data());
      return out;
    });
  } catch (const std::system_error& e) {
    // No thread to be had (a pids limit): summed here instead. An exception escaping the save
    // on one rank would leave the others waiting in its collectives for the deadline.
    SC_LOG(kWarn) << "no helper thread for checksums (" << e.what() << "); summing on the writing thread";
    hash_helpers_ = 0;
    return Sum(data, length);
  }
  const size_t first = sums_.size();
  sums_.resize(first + length / kBlockSize);
  background_.push_back(BackgroundSum{first, std::move(sums)});
}

void ShardFileWriter::JoinOldestSum() {
  BackgroundSum oldest = std::move(background_.front());
  background_.pop_front();
  std::vector<uint64_t> sums = oldest.sums.get();
  std::copy(sums.begin(), sums.end(), sums_.begin() + static_cast<std::ptrdiff_t>(oldest.first));
}

void ShardFileWriter::Sum(const unsigned char* data, size_t length) {
  size_t first = sums_.size();
  sums_.resize(first + length / kBlockSize);
  ChecksumBlocks(data, length, sums_.data() + first);
}

Status ShardFileWriter::BeforeWrite(size_t buffer, const unsigned char* data, size_t length) {
  // Pieces from several devices may share the buffer: every copy into it must have landed.
  for (DeviceCopier* copier : copying_[buffer]) {
    SC_RETURN_IF_ERROR(copier->WaitSlot(buffer).WithContext("writing " + name_));
  }
  copying_[buffer].clear();
  // The blocks StageHashed summed as it copied them are done; the rest (zero padding, device
  // copies, a partial block completed since) are summed here, after them, in file order.
  if (checksumming_) Sum(data + hashed_, length - hashed_);
  hashed_ = 0;
  return Status::Ok();
}

// One pass over the bytes: each run of blocks is summed right after it is copied into the ring,
// while it is still in cache, instead of a copy of the whole buffer and then a checksum pass over
// it from memory. Every block a copy completes is summed then, with the blocks before it not
// summed yet (padding, the start of a packed chunk's block), so sums stay in file order; only
// the partial block at the end waits for the next copy. Packed small chunks mostly end off a
// block: summing only runs that started on one left 8 MiB buffers of them to BeforeWrite, read
// back from memory. Not while a device copy into the buffer may still be landing: then the bytes
// are only copied, and BeforeWrite sums the buffer's rest.
Status ShardFileWriter::StageHashed(const unsigned char* p, size_t bytes) {
  while (bytes > 0) {
    const size_t buffer = writer_.current_buffer();
    if (!copying_[buffer].empty()) return writer_.Stage(p, bytes);
    const size_t n = std::min({bytes, writer_.room_bytes(), kHashRunBytes});
    std::memcpy(writer_.room(), p, n);
    const size_t whole = AlignDown(writer_.filled() + n, kBlockSize);
    if (hashed_ < whole) {
      Sum(pool_->at(buffer).data() + hashed_, whole - hashed_);
      hashed_ = whole;
    }
    p += n;
    bytes -= n;
    SC_RETURN_IF_ERROR(writer_.Advance(n));
  }
  return Status::Ok();
}

Status ShardFileWriter::PadTo(uint64_t offset) {
  static const unsigned char kZeros[kBlockSize] = {};
  while (writer_.position() < offset) {
    SC_RETURN_IF_ERROR(writer_.Stage(kZeros, std::min<uint64_t>(kBlockSize, offset - writer_.position())));
  }
  return Status::Ok();
}

Status ShardFileWriter::PadToBlock() { return PadTo(AlignUp(writer_.position(), kBlockSize)); }

Status ShardFileWriter::FlushRun() {
  if (run_bytes_ > 0) SC_RETURN_IF_ERROR(writer_.WriteInPlace(run_, run_offset_, run_bytes_));
  run_bytes_ = 0;
  return Status::Ok();
}

// `bytes` of padded memory at an aligned position: checksummed now (so the table stays in file
// order), written when the run reaches a buffer's size or stops being adjacent.
Status ShardFileWriter::AppendInPlace(const unsigned char* data, size_t bytes) {
  SC_RETURN_IF_ERROR(writer_.FlushStaged());
  const size_t length = AlignUp(bytes, kBlockSize);
  SumInPlace(data, length);
  const uint64_t position = writer_.position();
  if (run_bytes_ > 0 && (run_ + run_bytes_ != data || run_offset_ + run_bytes_ != position)) {
    SC_RETURN_IF_ERROR(FlushRun());
  }
  if (run_bytes_ == 0) {
    run_ = data;
    run_offset_ = position;
  }
  run_bytes_ += length;
  writer_.Reserve(length);
  const size_t chunk = pool_->buffer_bytes();
  while (run_bytes_ >= chunk) {
    SC_RETURN_IF_ERROR(writer_.WriteInPlace(run_, run_offset_, chunk));
    run_ += chunk;
    run_offset_ += chunk;
    run_bytes_ -= chunk;
  }
  return Status::Ok();
}

Result<uint64_t> ShardFileWriter::Append(const void* data, size_t bytes, size_t element_size) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t chunk = pool_->buffer_bytes();
  const uint64_t offset = ChunkOffset(writer_.position(), bytes, element_size, packing_);
  if (bytes == 0) return offset;  // holds nothing: no padding, and a run stays unbroken
  const bool page_aligned = reinterpret_cast<uintptr_t>(p) % kDirectIoAlignment == 0;
  // Without O_DIRECT (memory-backed file systems) any address may be written from directly, but
  // only a page-aligned chunk can be padded memory: its tail up to the next page is ours to write
  // only then (anything else is a caller's object, and whatever the heap holds past it would be
  // summed and written, and may change before the write).
  const bool aligned = page_aligned || !writer_.file().direct();
  const bool on_block = offset % kBlockSize == 0;  // packed chunks are staged
  if (padded_ && page_aligned && on_block) {
    SC_RETURN_IF_ERROR(PadTo(offset));
    SC_RETURN_IF_ERROR(AppendInPlace(p, bytes));
    return offset;
  }
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadTo(offset));
  if (!always_stage_ && aligned && on_block && bytes >= chunk) {
    SC_RETURN_IF_ERROR(writer_.FlushStaged());  // at a block boundary: the position is aligned now
    size_t direct = AlignDown(bytes, kBlockSize);
    for (size_t done = 0; done < direct; done += chunk) {
      size_t length = std::min(chunk, direct - done);
      SumInPlace(p + done, length);
      SC_RETURN_IF_ERROR(writer_.WriteInPlace(p + done, writer_.position(), length));
      writer_.Reserve(length);
    }
    p += direct;
    bytes -= direct;
  }
  SC_RETURN_IF_ERROR(StageHashed(p, bytes));
  return offset;
}

Result<uint64_t> ShardFileWriter::AppendStaged(const void* data, size_t bytes) {
  const uint64_t offset = ChunkOffset(writer_.position(), bytes, 1, packing_);
  if (bytes == 0) return offset;
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadTo(offset));
  SC_RETURN_IF_ERROR(StageHashed(static_cast<const unsigned char*>(data), bytes));
  return offset;
}

Result<uint64_t> ShardFileWriter::AppendFromDevice(const void* device_data, size_t bytes, DeviceCopier* copier,
                                                   size_t element_size) {
  const uint64_t offset = ChunkOffset(writer_.position(), bytes, element_size, packing_);
  if (bytes == 0) return offset;
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadTo(offset));
  const auto* p = static_cast<const unsigned char*>(device_data);
  while (bytes > 0) {
    const size_t buffer = writer_.current_buffer();
    size_t n = std::min(bytes, writer_.room_bytes());
    SC_RETURN_IF_ERROR(copier->CopyToHostAsync(writer_.room(), p, n, buffer));
    std::vector<DeviceCopier*>& copiers = copying_[buffer];
    if (std::find(copiers.begin(), copiers.end(), copier) == copiers.end()) copiers.push_back(copier);
    p += n;
    bytes -= n;
    SC_RETURN_IF_ERROR(writer_.Advance(n));
  }
  return offset;
}

Result<FileRecord> ShardFileWriter::Finish() {
  SC_RETURN_IF_ERROR(FlushRun());
  SC_RETURN_IF_ERROR(PadToBlock());
  SC_RETURN_IF_ERROR(writer_.FlushStaged());
  while (!background_.empty()) JoinOldestSum();
  FileRecord record;
  record.name = name_;
  record.table_offset = writer_.position();
  // The table: one u64 per data block, padded to whole pages, each page checksummed for the
  // manifest.
  const uint64_t pages = TablePages(record.table_offset);
  std::vector<uint64_t> table(pages * kSumsPerTablePage, 0);
  std::copy(sums_.begin(), sums_.end(), table.begin());
  for (uint64_t page = 0; page < pages; ++page) {
    record.table_page_sums.push_back(Checksum64(table.data() + page * kSumsPerTablePage, kBlockSize));
  }
  checksumming_ = false;
  SC_RETURN_IF_ERROR(writer_.Stage(table.data(), table.size() * 8));
  SC_RETURN_IF_ERROR(writer_.Finish());
  record.size = writer_.position();
  return record;
}

}  // namespace shardckpt
