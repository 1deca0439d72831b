// Staging memory kept between saves and loads of one process. A training job loads (and saves)
// the same layout again and again; a fresh BufferPool each time costs an allocation and, worse,
// the first touch of every staging page (page faults and zeroing by the kernel) on every call,
// which dominated loads of many small entries. A lease takes the spare pool when it will do
// (buffers at least as large as asked, at least `min_count` of them, same allocator) and gives it
// back when it ends; otherwise it allocates one of its own, which then becomes the spare if it
// is the larger. One spare per process and use (StagingUse): memory held between calls is at
// most one pool per use, and ReleaseSpareStaging frees them.
#pragma once

#include <cstddef>
#include <memory>

#include "shardckpt/io/aligned_buffer.h"

namespace shardckpt {

// What a pool is for. Each use keeps a spare of its own: a load's read ahead wants one buffer
// the size of a file, the pipelines several of a few MiB, and one spare for both would be
// replaced, and its memory faulted in afresh, at every load.
enum class StagingUse { kPipeline, kReadAhead };

class StagingLease {
 public:
  // `count` buffers of `buffer_bytes` when allocating; the spare serves with as few as
  // `min_count` (fewer reads or writes in flight, none smaller; 0: `count`). `keep`: false gives a pool of
  // its own that is freed at the end, the spare left alone.
  static Result<StagingLease> Acquire(size_t count, size_t buffer_bytes, HostAllocator allocator, bool keep = true,
                                      size_t min_count = 0, StagingUse use = StagingUse::kPipeline);
  StagingLease() = default;
  StagingLease(StagingLease&&) noexcept = default;
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease();

  // At least the buffers asked for: it may hold more, or larger ones.
  BufferPool* pool() const { return pool_.get(); }
  bool reused() const { return reused_; }

 private:
  void Return();
  std::unique_ptr<BufferPool> pool_;
  HostAllocator allocator_;
  StagingUse use_ = StagingUse::kPipeline;
  bool keep_ = true;
  bool reused_ = false;
};

// Frees the spare pools, if any (tests, and processes done with checkpoints).
void ReleaseSpareStaging();

}  // namespace shardckpt
