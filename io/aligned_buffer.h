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
// Page-aligned memory on small pages whatever its size: from a huge page up, a mapping of its own
// advised MADV_NOHUGEPAGE (so also where THP is "always"), unmapped when released.
HostAllocator SmallPageHostAllocator();
// Whether a fresh huge page costs more here than the small faults it saves. Where the host takes
// back free guest memory (a virtio-balloon device with free page reporting, as on this project's
// test VMs) a fresh huge page waits for the host to back all of its 2 MiB: first touch ran at
// 0.33 GB/s against 2 GB/s for small pages (benchmarks/README.md, "Fresh huge pages on a host
// that takes back free memory"); on other hosts it is faster than small pages. Decided once per
// process from /sys (logged at info); SHARDCKPT_HUGE_PAGES=all answers no, =0 turns huge pages off
// altogether (HugePageStagingBytes).
bool FreshHugePagesCostly();
// For memory touched once and never pinned for I/O again (a decoded manifest's records, a one-off
// file's staging): small pages where FreshHugePagesCostly, else the default.
HostAllocator OneOffHostAllocator();
// The memory for buffers of `buffer_bytes` in all that about `bytes_through` bytes will pass
// through in their life (a reader's windows, an output file's ring): the default where each byte
// of the buffers is used at least kHugePageReuse times, else OneOffHostAllocator. Why: each
// O_DIRECT request into huge pages pins fewer of them (consolidating 1 GiB of 64 KiB tensors from
// 4 files, windows used 64 times: 1.6-1.8 s, against 2.1-2.3 s on small pages: about 0.8 ms saved
// per 2 MiB read), while a fresh huge page costs about 5 ms more than small ones where
// FreshHugePagesCostly: about 6 uses pay it back. Unknown use (`bytes_through` 0) is taken as long.
inline constexpr uint64_t kHugePageReuse = 8;
HostAllocator AllocatorForReuse(uint64_t bytes_through, uint64_t buffer_bytes);
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
