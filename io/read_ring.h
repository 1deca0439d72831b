// Aligned reads through an IoEngine into a ring of staging buffers, the counterpart of
// io/sequential_writer.h: up to pool.count() reads in flight, each owning one buffer (its tag)
// until its bytes have been handed to `on_read`; a read may instead land straight in memory the
// caller names (4096-aligned under O_DIRECT), still owning a slot while in flight. It serves the
// load's extent reader (engine/core/extent_reader) and `verify` (engine/core/verify).
//
// Errors: the first failure (a read, a submission or on_read) stops the ring: later Reads return
// it, and Finish waits for the rest without handing them over, returns it and clears it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {

class ReadRing {
 public:
  // A completed read: the caller's request number and where its bytes are.
  using OnRead = std::function<Status(size_t request, const unsigned char* data)>;

  ReadRing(IoEngine* io, BufferPool* pool, OnRead on_read)
      : io_(io), pool_(pool), on_read_(std::move(on_read)), request_in_(pool->count(), kFree),
        into_(pool->count(), nullptr) {}
  ~ReadRing() { io_->Drain().IgnoreError(); }

  // Queues a read of `length` bytes (at most a buffer's) at `offset`, into `into` where given, else
  // into the next staging buffer, once that buffer's previous read has been handed over.
  Status Read(File* file, uint64_t offset, size_t length, size_t request, unsigned char* into = nullptr);
  // Waits for every read in flight; returns the first failure since the last Finish.
  Status Finish();

 private:
  static constexpr size_t kFree = SIZE_MAX;
  void ReapOne();

  IoEngine* io_;
  BufferPool* pool_;
  OnRead on_read_;
  std::vector<size_t> request_in_;             // per buffer: the request in flight there
  std::vector<unsigned char*> into_;           // per buffer: the caller's memory it reads into, if any
  size_t next_ = 0;
  Status failure_;
};

}  // namespace shardckpt
