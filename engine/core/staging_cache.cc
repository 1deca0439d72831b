#include "shardckpt/engine/core/staging_cache.h"

#include <algorithm>
#include <mutex>

namespace shardckpt {
namespace {

struct Spare {
  std::mutex mutex;
  std::unique_ptr<BufferPool> pool;
  HostAllocator allocator;
};

Spare& TheSpare(StagingUse use) {
  static Spare* spares = new Spare[2];  // never destroyed: leases may end during exit
  return spares[use == StagingUse::kReadAhead ? 1 : 0];
}

bool SameAllocator(const HostAllocator& a, const HostAllocator& b) {
  return a.allocate == b.allocate && a.release == b.release;
}

uint64_t TotalBytes(const BufferPool& pool) { return static_cast<uint64_t>(pool.count()) * pool.buffer_bytes(); }

}  // namespace

Result<StagingLease> StagingLease::Acquire(size_t count, size_t buffer_bytes, HostAllocator allocator, bool keep,
                                           size_t min_count, StagingUse use) {
  StagingLease lease;
  lease.allocator_ = allocator;
  lease.use_ = use;
  lease.keep_ = keep;
  if (keep) {
    Spare& spare = TheSpare(use);
    std::lock_guard<std::mutex> lock(spare.mutex);
    const size_t needed = min_count == 0 ? count : std::min(count, min_count);
    if (spare.pool && SameAllocator(spare.allocator, allocator) && spare.pool->count() >= needed &&
        spare.pool->buffer_bytes() >= buffer_bytes) {
      lease.pool_ = std::move(spare.pool);
      lease.reused_ = true;
      return lease;
    }
  }
  SC_ASSIGN_OR_RETURN(lease.pool_, BufferPool::Create(count, buffer_bytes, allocator));
  return lease;
}

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    Return();
    pool_ = std::move(other.pool_);
    allocator_ = other.allocator_;
    use_ = other.use_;
    keep_ = other.keep_;
    reused_ = other.reused_;
  }
  return *this;
}

StagingLease::~StagingLease() { Return(); }

void StagingLease::Return() {
  if (!pool_ || !keep_) {
    pool_.reset();
    return;
  }
  std::unique_ptr<BufferPool> dropped;  // freed outside the lock
  Spare& spare = TheSpare(use_);
  std::lock_guard<std::mutex> lock(spare.mutex);
  if (!spare.pool || TotalBytes(*pool_) >= TotalBytes(*spare.pool)) {
    dropped = std::move(spare.pool);
    spare.pool = std::move(pool_);
    spare.allocator = allocator_;
  } else {
    dropped = std::move(pool_);
  }
}

void ReleaseSpareStaging() {
  for (StagingUse use : {StagingUse::kPipeline, StagingUse::kReadAhead}) {
    std::unique_ptr<BufferPool> dropped;
    Spare& spare = TheSpare(use);
    std::lock_guard<std::mutex> lock(spare.mutex);
    dropped = std::move(spare.pool);
  }
}

}  // namespace shardckpt
