#include "shardckpt/engine/model/record_arena.h"

#include <algorithm>
#include <new>

#include "shardckpt/io/aligned_buffer.h"

namespace shardckpt {
namespace {
// The first block is one huge page; each next one doubles, up to 64 MiB: a 164 MB decode takes 7
// blocks, and a list never waits on more than one fresh block.
constexpr size_t kFirstBlockBytes = size_t{2} << 20;
constexpr size_t kLargestBlockBytes = size_t{64} << 20;
constexpr size_t kAlignment = alignof(std::max_align_t);
}  // namespace

RecordArena::~RecordArena() {
  const HostAllocator allocator = DefaultHostAllocator();
  for (const auto& [block, bytes] : blocks_) allocator.release(block);
}

void* RecordArena::Allocate(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + kAlignment - 1) & ~(kAlignment - 1);
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<size_t>(end_ - next_) < bytes) {
    size_t block_bytes = blocks_.empty() ? kFirstBlockBytes : std::min(blocks_.back().second * 2, kLargestBlockBytes);
    block_bytes = std::max(block_bytes, bytes);
    blocks_.reserve(blocks_.size() + 1);  // so that the push below cannot throw and leak the block
    void* block = DefaultHostAllocator().allocate(block_bytes);
    if (block == nullptr) throw std::bad_alloc();
    blocks_.emplace_back(block, block_bytes);
    next_ = static_cast<char*>(block);
    end_ = next_ + block_bytes;
  }
  void* out = next_;
  next_ += bytes;
  return out;
}

size_t RecordArena::ReservedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& block : blocks_) total += block.second;
  return total;
}

}  // namespace shardckpt
