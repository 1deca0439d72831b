// Streams one rank's data file: chunks at the offsets engine/model/chunk_packing.h assigns (small
// ones packed, large ones on 4096-byte blocks), then the checksum table (see manifest.h for the
// layout), then fdatasync. Packed chunks are always staged: the ring turns the unaligned layout
// into whole-block O_DIRECT writes.
//
// The file goes through the library's aligned sequential writer (io/sequential_writer.h); what
// is this file's own is the checksums, the runs of padded memory and the device copies.
// Bytes are copied into the staging ring (the BufferPool) in runs of a few blocks, each run
// checksummed right after its copy while it is in cache (one pass over the bytes), and written from there with up to pool.count() writes in flight, so copying the next
// buffer overlaps the writes of the previous ones. A chunk of at least one buffer whose memory is
// already 4096-aligned (or any such chunk, on a memory-backed file system opened without
// O_DIRECT) has its whole blocks written straight from the caller's memory in buffer-sized
// pieces, unless `always_stage`; only its last partial block is copied.
//
// Memory written in place is summed block by block too; runs of a MiB or more on up to
// `hash_helpers` helper threads (by default one less than the cores, at most 4) while their writes
// are in flight, so where a rank has spare cores the checksums cost no time on its own.
//
// `padded` memory (AsyncSaver's snapshot area: every chunk starts on a page and the memory up to
// the next page boundary is readable and zero): chunks that go on a block (1 MiB or more, or all
// with packing off) and start on a page are written in place, tail included, and chunks adjacent
// in memory go out together in buffer-sized writes; anything else (packed small chunks, memory
// that does not start on a page, with or without O_DIRECT) is staged, so nothing past its end is
// read.
//
// Device chunks (AppendFromDevice) go through the same ring: a device-to-host copy is enqueued
// into the buffer being filled and only waited for (its buffer's events, one per device copier
// that filled part of it) when that buffer is checksummed and written, so the copy of one buffer
// overlaps the writes of the ones before.
#pragma once

#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/model/chunk_packing.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/device_memory.h"
#include "shardckpt/io/io_engine.h"
#include "shardckpt/io/sequential_writer.h"

namespace shardckpt {

class ShardFileWriter {
 public:
  ShardFileWriter(IoEngine* io, BufferPool* pool, bool always_stage, bool padded = false,
                  size_t hash_helpers = DefaultHashHelpers());
  static size_t DefaultHashHelpers();

  // Waits for device copies still landing in the pool's buffers (a write that failed midway
  // leaves some queued): the pool outlives the writer (the async ring, the kept spare) and its
  // next user must not have its bytes overwritten by a late copy.
  ~ShardFileWriter();

  Status Open(const std::string& dir, const std::string& name);
  // Where chunks go; packing on by default. Set before the first Append.
  void set_packing(const ChunkPacking& packing) { packing_ = packing; }
  // Appends a chunk of `element_size`-byte elements (1 for blobs) at ChunkOffset and returns that
  // offset. `data` must stay valid and unchanged until Finish returns.
  Result<uint64_t> Append(const void* data, size_t bytes, size_t element_size = 1);
  // Memory outside a padded area (a blob's bytes): always copied through the ring, whatever its
  // address, so nothing past `bytes` is read; otherwise as Append with 1-byte elements.
  Result<uint64_t> AppendStaged(const void* data, size_t bytes);
  // The same for `bytes` of device memory, copied out by `copier` (the pool should be pinned).
  Result<uint64_t> AppendFromDevice(const void* device_data, size_t bytes, DeviceCopier* copier,
                                    size_t element_size = 1);
  // Writes the checksum table, waits for every write and syncs. Returns the file's record.
  Result<FileRecord> Finish();

 private:
  Status PadTo(uint64_t offset);  // zeros up to `offset`
  Status PadToBlock();
  // Each staged buffer, before it is written: its device copies waited for, its blocks summed.
  Status BeforeWrite(size_t buffer, const unsigned char* data, size_t length);
  void Sum(const unsigned char* data, size_t length);
  Status StageHashed(const unsigned char* data, size_t bytes);
  void SumInPlace(const unsigned char* data, size_t length);
  void JoinOldestSum();
  static constexpr size_t kBackgroundSumBytes = 1u << 20;
  // Copy-and-sum runs: small enough to stay in a core's cache between the copy and the sums.
  static constexpr size_t kHashRunBytes = 64u << 10;
  Status AppendInPlace(const unsigned char* data, size_t bytes);
  Status FlushRun();

  BufferPool* pool_;
  bool always_stage_;
  bool padded_;
  size_t hash_helpers_;
  // Sums of in-place runs being computed: their first slot in sums_ and the result.
  struct BackgroundSum {
    size_t first;
    std::future<std::vector<uint64_t>> sums;
  };
  std::deque<BackgroundSum> background_;
  ChunkPacking packing_;
  std::vector<std::vector<DeviceCopier*>> copying_;  // per buffer: copiers with copies not waited for
  SequentialWriter writer_;  // after copying_: its destructor waits for writes that may still use them
  std::string name_;
  bool checksumming_ = true; // off while the table itself is written
  size_t hashed_ = 0;        // bytes at the start of the buffer being filled whose sums are in sums_
  // Padded bytes checksummed and placed but not yet submitted: run_bytes_ at run_, for the file
  // at run_offset_, grown while the next chunk is adjacent in memory.
  const unsigned char* run_ = nullptr;
  size_t run_bytes_ = 0;
  uint64_t run_offset_ = 0;
  std::vector<uint64_t> sums_;
};

}  // namespace shardckpt
