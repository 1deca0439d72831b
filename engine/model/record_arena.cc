#include "shardckpt/engine/model/record_arena.h"

#include <pthread.h>

#include <algorithm>
#include <new>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"

namespace shardckpt {
namespace {
// The first block is one huge page; each next one doubles, up to 64 MiB: a 164 MB decode takes 7
// blocks, and a list never waits on more than one fresh block.
constexpr size_t kFirstBlockBytes = size_t{2} << 20;
constexpr size_t kLargestBlockBytes = size_t{64} << 20;
constexpr size_t kAlignment = alignof(std::max_align_t);

// Blocks of arenas that are gone, kept for the next: a process that decodes again (a message after
// its text, the next load) reuses memory already faulted in, where the heap would have reused
// what it kept. Without them a warm decode of 40,000 chunks took 4.3-4.8 ms instead of 2.8 (the
// manifest message, best of 10). At most kCachedBytes are kept; arenas ask for the same
// doubling sizes, so a block is taken again only at its own size.
constexpr size_t kCachedBytes = size_t{64} << 20;
struct BlockCache {
  std::mutex mutex;
  std::vector<std::pair<void*, size_t>> blocks;
  size_t bytes = 0;
};
BlockCache& Cache() {
  // Never destroyed: arenas may be freed by static destructors after it would be. Room for every
  // block it may keep (64 MiB of 2 MiB blocks at most), so that keeping one never allocates.
  static BlockCache* const cache = [] {
    auto* made = new BlockCache();
    made->blocks.reserve(kCachedBytes / kFirstBlockBytes);
    return made;
  }();
  return *cache;
}
// A fork while another thread (the helper thread freeing a manifest) holds the lock would leave
// the child's copy locked for good. Registered as the program starts, before any thread can fork.
[[maybe_unused]] const bool kForkHandlersRegistered = [] {
  pthread_atfork([] { Cache().mutex.lock(); }, [] { Cache().mutex.unlock(); }, [] { Cache().mutex.unlock(); });
  return true;
}();

// The sizes arenas ask for: 2 MiB doubling up to 64 MiB. Only those are kept; a block made for one
// large request would rarely be asked for again at its size.
bool StandardBlockSize(size_t bytes) {
  for (size_t size = kFirstBlockBytes; size <= kLargestBlockBytes; size *= 2) {
    if (bytes == size) return true;
  }
  return false;
}

void* TakeBlock(size_t bytes) {
  // arena.block: as if the system had no memory for it (the decoders then fail as out of memory).
  if (!Failpoint("arena.block", "a record arena's block").ok()) return nullptr;
  {
    BlockCache& cache = Cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (auto it = cache.blocks.begin(); it != cache.blocks.end(); ++it) {
      if (it->second == bytes) {
        void* block = it->first;
        cache.bytes -= bytes;
        cache.blocks.erase(it);
        return block;
      }
    }
  }
  return OneOffHostAllocator().allocate(bytes);
}

void GiveBack(void* block, size_t bytes) {
  {
    BlockCache& cache = Cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (StandardBlockSize(bytes) && cache.bytes + bytes <= kCachedBytes) {
      cache.blocks.emplace_back(block, bytes);
      cache.bytes += bytes;
      return;
    }
  }
  OneOffHostAllocator().release(block);
}
}  // namespace

RecordArena::~RecordArena() {
  for (const auto& [block, bytes] : blocks_) GiveBack(block, bytes);
}

void* RecordArena::Allocate(size_t bytes) {
  bytes = static_cast<size_t>(AlignUp(std::max<size_t>(bytes, 1), kAlignment));
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<size_t>(end_ - next_) < bytes) {
    size_t block_bytes = blocks_.empty() ? kFirstBlockBytes : std::min(blocks_.back().second * 2, kLargestBlockBytes);
    block_bytes = std::max(block_bytes, bytes);
    blocks_.reserve(blocks_.size() + 1);  // so that the push below cannot throw and leak the block
    void* block = TakeBlock(block_bytes);
    if (block == nullptr) throw std::bad_alloc();
    blocks_.emplace_back(block, block_bytes);
    next_ = static_cast<char*>(block);
    end_ = next_ + block_bytes;
  }
  void* out = next_;
  next_ += bytes;
  return out;
}

size_t RecordArenaCachedBytes() {
  BlockCache& cache = Cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.bytes;
}

void ReleaseCachedArenaBlocks() {
  std::vector<std::pair<void*, size_t>> blocks;
  {
    BlockCache& cache = Cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    blocks.swap(cache.blocks);
    cache.bytes = 0;
  }
  for (const auto& block : blocks) OneOffHostAllocator().release(block.first);
}

size_t RecordArena::ReservedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& block : blocks_) total += block.second;
  return total;
}

}  // namespace shardckpt
