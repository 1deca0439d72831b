#include "shardckpt/io/aligned_buffer.h"

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {
std::atomic<uint64_t> g_allocations{0};

// Host buffers of a huge page (2 MiB on x86-64) and more get a mapping of their own, aligned to
// the huge page and advised for transparent huge pages. A fresh 8 MiB buffer then faults 4 times
// instead of 2048 (a 256 MB consolidation: 10,739 page faults -> 2,580), and each O_DIRECT request
// pins a few huge pages instead of thousands of small ones. Their own mapping, not the heap:
// madvise outlives free(), and heap memory that other allocations reuse would get huge pages
// nobody asked for. Only a hint: where THP is off it changes nothing. SHARDCKPT_HUGE_PAGES=0 turns
// it off, for hosts where compaction stalls on a huge-page fault would hurt more than the faults.
// Memory used only a few times asks for small pages itself where fresh huge pages are costly
// (OneOffHostAllocator, AllocatorForReuse).
constexpr size_t kUndecided = SIZE_MAX;
std::atomic<size_t> g_huge_page_bytes{kUndecided};

// The kernel's THP size, 0 where THP is absent or set to "never".
size_t KernelHugePageBytes() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(enabled, modes) || modes.find("[never]") != std::string::npos) return 0;
  std::ifstream size_file("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  size_t bytes = 0;
  if (!(size_file >> bytes) || bytes < kDirectIoAlignment || (bytes & (bytes - 1)) != 0) return 0;
  return bytes;
}

// Mappings made for huge pages, by address: release unmaps them, frees everything else.
std::mutex g_mapped_mutex;
// Huge-page buffers are freed on helper threads too (a decoded manifest's arena, freed off a
// load's path): a fork while one holds the lock would leave the child's copy locked for good.
[[maybe_unused]] const bool kMappedForkHandlers = [] {
  pthread_atfork([] { g_mapped_mutex.lock(); }, [] { g_mapped_mutex.unlock(); }, [] { g_mapped_mutex.unlock(); });
  return true;
}();
std::unordered_map<void*, size_t>& Mapped() {
  static auto* mapped = new std::unordered_map<void*, size_t>();
  return *mapped;
}

// A mapping of its own for `bytes`, starting on a multiple of `align` (a huge page, or the 4 KiB
// every mapping starts on), advised `advice` (MADV_HUGEPAGE or MADV_NOHUGEPAGE); released by
// DefaultRelease, which unmaps what is in Mapped().
void* MapPages(size_t bytes, size_t align, int advice) {
  bytes = AlignUp(bytes, kDirectIoAlignment);
  const size_t length = align > kDirectIoAlignment ? bytes + align : bytes;  // room to start on `align`
  void* raw = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = AlignUp(start, align);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + length - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  void* ptr = reinterpret_cast<void*>(aligned);
  if (madvise(ptr, bytes, advice) != 0) {
    const int error = errno;
    const bool huge = advice == MADV_HUGEPAGE;
    LogOnce(LogLevel::kInfo, huge ? "staging.madvise_hugepage" : "staging.madvise_nohugepage",
            std::string(huge ? "transparent huge pages refused for staging buffers (madvise: "
                             : "small pages refused for one-off buffers (madvise: ") +
                std::strerror(error) + (huge ? "); they use small pages" : "); the kernel may give them huge pages"));
  }
  std::lock_guard<std::mutex> lock(g_mapped_mutex);
  Mapped()[ptr] = bytes;
  return ptr;
}

void* DefaultAllocate(size_t bytes) {
  const size_t page = HugePageStagingBytes();
  if (page != 0 && bytes >= page) return MapPages(bytes, page, MADV_HUGEPAGE);
  void* ptr = nullptr;
  if (posix_memalign(&ptr, kDirectIoAlignment, bytes) != 0) return nullptr;
  return ptr;
}

void DefaultRelease(void* ptr) {
  size_t mapped = 0;
  {
    std::lock_guard<std::mutex> lock(g_mapped_mutex);
    auto it = Mapped().find(ptr);
    if (it != Mapped().end()) {
      mapped = it->second;
      Mapped().erase(it);
    }
  }
  if (mapped != 0) {
    munmap(ptr, mapped);
  } else {
    std::free(ptr);
  }
}
}  // namespace

uint64_t HostBufferAllocations() { return g_allocations; }

size_t HugePageStagingBytes() {
  size_t bytes = g_huge_page_bytes.load();
  if (bytes != kUndecided) return bytes;
  const char* env = std::getenv("SHARDCKPT_HUGE_PAGES");  // read once, on the first large buffer
  const size_t decided = env != nullptr && std::strcmp(env, "0") == 0 ? 0 : KernelHugePageBytes();
  size_t expected = kUndecided;
  g_huge_page_bytes.compare_exchange_strong(expected, decided);
  return g_huge_page_bytes.load();
}

void SetHugePageStaging(bool on) { g_huge_page_bytes = on ? KernelHugePageBytes() : 0; }

HostAllocator DefaultHostAllocator() { return HostAllocator{&DefaultAllocate, &DefaultRelease, "aligned"}; }

// A buffer of a huge page or more gets a mapping of its own advised MADV_NOHUGEPAGE: where THP is
// "always", the heap's large chunks would get huge pages anyway; and unmapped on release, it is
// given back (glibc keeps large freed chunks in its heap once its mmap threshold has grown).
HostAllocator SmallPageHostAllocator() {
  return HostAllocator{[](size_t bytes) -> void* {
                         static const size_t huge_page = KernelHugePageBytes();
                         if (huge_page != 0 && bytes >= huge_page) {
                           return MapPages(bytes, kDirectIoAlignment, MADV_NOHUGEPAGE);
                         }
                         void* ptr = nullptr;
                         return posix_memalign(&ptr, kDirectIoAlignment, bytes) == 0 ? ptr : nullptr;
                       },
                       &DefaultRelease, "aligned"};
}

namespace {
// Whether a virtio-balloon device here offers free page reporting (VIRTIO_BALLOON_F_REPORTING,
// feature bit 5; sysfs lists a device's features as '0'/'1' characters, bit 0 first).
bool HostTakesBackFreeMemory() {
  std::error_code error;
  const std::filesystem::path drivers = "/sys/bus/virtio/drivers/virtio_balloon";
  for (const auto& device : std::filesystem::directory_iterator(drivers, error)) {
    std::ifstream features(device.path() / "features");
    std::string bits;
    if (features >> bits && bits.size() > 5 && bits[5] == '1') return true;
  }
  return false;
}
}  // namespace

bool FreshHugePagesCostly() {
  // Where huge pages are off (SetHugePageStaging may turn them on again later) there is nothing to decide.
  if (HugePageStagingBytes() == 0) return false;
  static const bool costly = [] {
    const char* env = std::getenv("SHARDCKPT_HUGE_PAGES");
    if (env != nullptr && std::strcmp(env, "all") == 0) return false;
    if (!HostTakesBackFreeMemory()) return false;
    SC_LOG(kInfo) << "this host takes back free memory (virtio-balloon free page reporting), so a fresh huge page "
                     "is slow to fault in: memory used only a few times is on small pages (SHARDCKPT_HUGE_PAGES=all "
                     "puts it on huge pages)";
    return true;
  }();
  return costly;
}

HostAllocator OneOffHostAllocator() {
  return FreshHugePagesCostly() ? SmallPageHostAllocator() : DefaultHostAllocator();
}

HostAllocator AllocatorForReuse(uint64_t bytes_through, uint64_t buffer_bytes) {
  const bool long_use = bytes_through == 0 || buffer_bytes == 0 || bytes_through / buffer_bytes >= kHugePageReuse;
  return long_use ? DefaultHostAllocator() : OneOffHostAllocator();
}

Status EnsureAlignedBytes(AlignedBuffer* buffer, size_t bytes) {
  if (buffer->size() >= bytes) return Status::Ok();
  SC_ASSIGN_OR_RETURN(*buffer, AlignedBuffer::Allocate(bytes + bytes / 16));
  return Status::Ok();
}

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
