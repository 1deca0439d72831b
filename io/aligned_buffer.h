// Page-aligned host memory for O_DIRECT, and a pool that keeps it across saves so a training loop
// that checkpoints every few minutes does not re-fault gigabytes of staging memory each time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

inline constexpr size_t kDirectIoAlignment = 4096;

// Where staging memory comes from. The default is posix_memalign; the CUDA build registers a
// pinned allocator (cudaHostAlloc) so device-to-host copies run at full PCIe speed.
struct HostAllocator {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* ptr) = nullptr;
  const char* name = "aligned";
};
// The default allocator: page-aligned heap memory; buffers of a huge page and more get a mapping
// of their own, aligned to the huge page and advised for transparent huge pages (aligned_buffer.cc
// says why), unless SHARDCKPT_HUGE_PAGES=0 or the kernel has no THP. Pinned CUDA staging is not
// affected.
HostAllocator DefaultHostAllocator();
// The huge page size the default allocator uses (the kernel's hpage_pmd_size), 0 when it uses
// none. SetHugePageStaging overrides SHARDCKPT_HUGE_PAGES for this process (tests, or programs
// that decide in code); it affects later allocations only.
size_t HugePageStagingBytes();
void SetHugePageStaging(bool on);

// Successful AlignedBuffer::Allocate calls in this process, whatever the allocator: lets a test
// hold a pipeline to "no staging allocation after the first save".
uint64_t HostBufferAllocations();

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  static Result<AlignedBuffer> Allocate(size_t bytes, HostAllocator allocator = DefaultHostAllocator());
  AlignedBuffer(AlignedBuffer&& other) noexcept { *this = std::move(other); }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
  HostAllocator allocator_;
};

// Makes `*buffer` at least `bytes` long, for memory a caller keeps between uses (a repeat save's
// manifest staging): when it must grow, it grows to a sixteenth more, room for a text that grows
// by a little between saves (its metrics, its time). Its contents are not kept.
Status EnsureAlignedBytes(AlignedBuffer* buffer, size_t bytes);

// A fixed set of equal-sized buffers, handed out by index. Not thread-safe by design: one
// pipeline (a writer or a reader) owns it at a time.
class BufferPool {
 public:
  static Result<std::unique_ptr<BufferPool>> Create(size_t count, size_t buffer_bytes,
                                                    HostAllocator allocator = DefaultHostAllocator());
  size_t count() const { return buffers_.size(); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  AlignedBuffer& at(size_t i) { return buffers_[i]; }

 private:
  std::vector<AlignedBuffer> buffers_;
  size_t buffer_bytes_ = 0;
};

}  // namespace shardckpt
