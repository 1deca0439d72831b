// Memory for the chunk records of a large decoded manifest, and the allocator that draws from it.
//
// Why: 20,000 tensors resharded to 64 ranks are 1.28 million chunk records, 164 MB of fresh memory
// that a decode faults in one small page at a time: the allocation of the entries' chunk lists
// was 18% of `shardckpt consolidate`'s samples, nearly all of it page faults (2026-12-04). An
// arena takes its memory in blocks of 2 to 64 MiB and frees them all at once, from
// OneOffHostAllocator (io/aligned_buffer.h): records are written once and never pinned for I/O,
// so the blocks are on huge pages (512 times fewer faults) except where a fresh huge page costs
// more than those faults (a host that takes back free memory: benchmarks/README.md, "Fresh huge
// pages on a host that takes back free memory").
//
// A finished arena's blocks (those of the doubling sizes) are kept for the next arena, up to 64 MiB
// in the process: resident memory a process that decoded once keeps until it decodes again, or
// calls ReleaseCachedArenaBlocks.
//
// An ArenaAllocator holds its arena by shared_ptr, so a list outlives neither its memory nor a
// manifest that was moved. A list copy-constructed from an arena's list goes to the heap
// (select_on_container_copy_construction), so copying a decode's entries does not pin its arena;
// a list copy-assigned keeps its own allocator (records copied into a decoded list go to that
// decode's arena). A default-constructed allocator is the heap.
// Memory a list gives back inside an arena is reused only when the arena goes: lists that are
// decoded once at their size waste nothing, and one that grows afterwards wastes at most its old
// sizes (geometric: less than its final size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardckpt {

class RecordArena {
 public:
  RecordArena() = default;
  RecordArena(const RecordArena&) = delete;
  RecordArena& operator=(const RecordArena&) = delete;
  ~RecordArena();

  // `bytes` of memory aligned to alignof(std::max_align_t). Thread-safe. Throws std::bad_alloc
  // when no memory is to be had, as operator new does.
  void* Allocate(size_t bytes);
  // What the arena has taken from the system, for tests and figures.
  size_t ReservedBytes() const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> blocks_;
  char* next_ = nullptr;
  char* end_ = nullptr;
};

template <typename T>
class ArenaAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::false_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  ArenaAllocator() noexcept = default;
  explicit ArenaAllocator(std::shared_ptr<RecordArena> arena) noexcept : arena_(std::move(arena)) {}
  // Declared so that a move copies: a moved-from allocator must still equal the original (the
  // containers free through it), which an emptied shared_ptr would not.
  ArenaAllocator(const ArenaAllocator&) noexcept = default;
  ArenaAllocator& operator=(const ArenaAllocator&) noexcept = default;
  template <typename U>
  ArenaAllocator(const ArenaAllocator<U>& other) noexcept : arena_(other.arena()) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (arena_ == nullptr) return std::allocator<T>().allocate(n);
    static_assert(alignof(T) <= alignof(std::max_align_t), "over-aligned records need their own arena");
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(arena_->Allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (arena_ == nullptr) std::allocator<T>().deallocate(p, n);
  }
  ArenaAllocator select_on_container_copy_construction() const noexcept { return ArenaAllocator(); }

  const std::shared_ptr<RecordArena>& arena() const noexcept { return arena_; }

  template <typename U>
  friend bool operator==(const ArenaAllocator& a, const ArenaAllocator<U>& b) noexcept {
    return a.arena_ == b.arena();
  }
  template <typename U>
  friend bool operator!=(const ArenaAllocator& a, const ArenaAllocator<U>& b) noexcept {
    return !(a == b);
  }

 private:
  std::shared_ptr<RecordArena> arena_;
};

// Blocks of finished arenas kept for the next ones (process-wide, 64 MiB at most), so that a
// process that decodes again reuses memory it already faulted in, as the heap would.
size_t RecordArenaCachedBytes();
// Frees the kept blocks: for a program that wants that memory back now, and for tests.
void ReleaseCachedArenaBlocks();

// Where a decoder puts lists whose total size it cannot know ahead: an arena once the text it
// decodes is large enough that the arena's first huge page is well used, else the heap.
inline constexpr size_t kArenaMinTextBytes = size_t{1} << 20;

}  // namespace shardckpt
