#include "shardckpt/io/aligned_buffer.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {
std::atomic<uint64_t> g_allocations{0};

// Staging buffers of megabytes go on 2 MiB boundaries and ask for transparent huge pages: a
// fresh 8 MiB buffer then faults 4 times instead of 2048 (a 256 MB consolidation: 10,739 page
// faults -> 2,580), and each O_DIRECT request pins a few pages instead of thousands. Only a hint:
// where THP is off it changes nothing. SHARDCKPT_HUGE_PAGES=0 turns it off for hosts where
// compaction stalls on a huge-page fault would hurt more than the faults.
bool HugePagesWanted() {
  const char* env = std::getenv("SHARDCKPT_HUGE_PAGES");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

void* PosixAllocate(size_t bytes) {
  void* ptr = nullptr;
  const bool huge = bytes >= kHugePageBytes && HugePagesWanted();
  if (posix_memalign(&ptr, huge ? kHugePageBytes : kDirectIoAlignment, bytes) != 0) return nullptr;
  if (huge && madvise(ptr, bytes, MADV_HUGEPAGE) != 0) {
    static std::once_flag logged;
    std::call_once(logged, [] {
      SC_LOG(kInfo) << "transparent huge pages unavailable for staging buffers (madvise: " << std::strerror(errno)
                    << "); using 4 KiB pages";
    });
  }
  return ptr;
}
void PosixRelease(void* ptr) { std::free(ptr); }
}  // namespace

uint64_t HostBufferAllocations() { return g_allocations; }

HostAllocator DefaultHostAllocator() { return HostAllocator{&PosixAllocate, &PosixRelease, "aligned"}; }

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes, HostAllocator allocator) {
  AlignedBuffer buffer;
  size_t rounded = AlignUp(bytes == 0 ? kDirectIoAlignment : bytes, kDirectIoAlignment);
  void* ptr = allocator.allocate(rounded);
  if (ptr == nullptr) {
    return Status(Code::kInternal, "cannot allocate " + std::to_string(rounded) +
                                       " bytes of " + allocator.name + " staging memory");
  }
  g_allocations++;
  buffer.data_ = static_cast<unsigned char*>(ptr);
  buffer.size_ = rounded;
  buffer.allocator_ = allocator;
  return buffer;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) allocator_.release(data_);
    data_ = other.data_;
    size_ = other.size_;
    allocator_ = other.allocator_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  if (data_ != nullptr) allocator_.release(data_);
}

Result<std::unique_ptr<BufferPool>> BufferPool::Create(size_t count, size_t buffer_bytes,
                                                       HostAllocator allocator) {
  // Rings index their buffers modulo the count: an empty pool would divide by zero.
  if (count == 0 || buffer_bytes == 0) {
    return InvalidArgument("staging needs at least one buffer of at least one byte (asked for " + std::to_string(count) +
                           " of " + std::to_string(buffer_bytes) + " bytes: see staging_buffers / staging_buffer_bytes)");
  }
  auto pool = std::make_unique<BufferPool>();
  pool->buffer_bytes_ = AlignUp(buffer_bytes, kDirectIoAlignment);
  for (size_t i = 0; i < count; ++i) {
    SC_ASSIGN_OR_RETURN(AlignedBuffer buffer, AlignedBuffer::Allocate(pool->buffer_bytes_, allocator));
    pool->buffers_.push_back(std::move(buffer));
  }
  return pool;
}

}  // namespace shardckpt
