// One file written front to back with aligned writes through an IoEngine (O_DIRECT where the file
// system takes it, buffered with a log line where it does not): bytes are staged in a ring of
// aligned buffers, and each full buffer is written while the next one fills, with up to
// pool.count() writes in flight. Aligned memory the caller keeps valid can be written in place.
//
// The first buffers of a file are written when 1, 2, then 4 MiB of them are full, not the whole
// buffer (8 MiB by default): the disk starts writing after one small copy rather than idling
// while the first buffer fills. With thousands of small tensors, staged at a few GB/s, filling an
// 8 MiB buffer kept the disk idle for 3 ms of a 25 ms save.
// It serves rank data files (engine/core/shard_writer) and exported files
// (engine/formats/output_file); each adds what its format needs in a BeforeWrite hook.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {

class SequentialWriter {
 public:
  // Runs on each staged buffer just before it is submitted: `length` is whole blocks and the bytes
  // past those staged are zero. The shard writer waits for device copies and checksums here.
  using BeforeWrite = std::function<Status(size_t buffer, const unsigned char* data, size_t length)>;

  SequentialWriter(IoEngine* io, BufferPool* pool, BeforeWrite before_write = nullptr)
      : io_(io),
        pool_(pool),
        before_write_(std::move(before_write)),
        busy_(pool->count(), false),
        capacity_(std::min(kFirstWriteBytes, pool->buffer_bytes())) {}
  ~SequentialWriter();  // waits for the writes in flight

  Status Open(const std::string& path);
  const File& file() const { return *file_; }
  // File offset of the next byte staged or written.
  uint64_t position() const { return position_; }

  // Copies bytes into the ring; full buffers are written as they fill.
  Status Stage(const void* data, size_t bytes);
  // For a producer that fills the ring itself (device-to-host copies): the buffer being filled,
  // where its free room starts and how large that is. Advance(n) counts n bytes placed there.
  size_t current_buffer() const { return current_; }
  unsigned char* room() const { return pool_->at(current_).data() + fill_; }
  size_t room_bytes() const { return capacity_ - fill_; }
  // Bytes staged in the buffer being filled.
  size_t filled() const { return fill_; }
  Status Advance(size_t bytes);
  // Writes what is staged, zero-padded to a whole block: position() moves past the padding.
  Status FlushStaged();

  // `length` bytes of memory that stays valid until Finish, written at `offset` without a copy
  // (4096-aligned memory under O_DIRECT). Nothing may be staged between position() and offset.
  Status WriteInPlace(const void* data, uint64_t offset, size_t length);
  // Moves position() past `length` bytes that WriteInPlace writes later; nothing may be staged.
  void Reserve(uint64_t length) { position_ += length; }

  // Flushes, waits for every write, cuts the file to `exact_size` where given (the padding of a
  // last partial block) and fdatasyncs it, then closes it.
  Status Finish(std::optional<uint64_t> exact_size = std::nullopt);

 private:
  static constexpr uint64_t kInPlaceTag = ~uint64_t{0};
  Status ReapOne();
  Status ReapWhileFull();

  IoEngine* io_;
  BufferPool* pool_;
  BeforeWrite before_write_;
  std::vector<bool> busy_;  // per buffer: a write from it in flight
  std::unique_ptr<File> file_;
  static constexpr size_t kFirstWriteBytes = 1u << 20;
  size_t current_ = 0;      // buffer being filled
  size_t fill_ = 0;         // bytes in it
  size_t capacity_;         // written when this full: doubles from kFirstWriteBytes to the buffer size
  uint64_t position_ = 0;
};

}  // namespace shardckpt
