// Staging memory kept between loads and saves (engine/core/staging_cache.h): the spare pool is
// taken only when large enough and with the same allocator, the larger pool stays, and loads
// that reuse it neither allocate staging again nor hand back bytes of an earlier load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

TEST(StagingLease, TakesTheSpareWhenLargeEnoughAndKeepsTheLarger) {
  ReleaseSpareStaging();
  BufferPool* first = nullptr;
  {
    StagingLease a = StagingLease::Acquire(2, 8192, DefaultHostAllocator()).value();
    EXPECT_FALSE(a.reused());
    first = a.pool();
    std::memset(first->at(0).data(), 0x5A, 8192);
  }
  {
    // Fewer, smaller buffers: the spare serves, as it is (two buffers of 8192).
    StagingLease b = StagingLease::Acquire(1, 4096, DefaultHostAllocator()).value();
    EXPECT_TRUE(b.reused());
    EXPECT_EQ(b.pool(), first);
    EXPECT_EQ(b.pool()->count(), 2u);
    EXPECT_EQ(b.pool()->buffer_bytes(), 8192u);
    // While it is out, another lease gets a pool of its own; the smaller goes when both end.
    StagingLease c = StagingLease::Acquire(1, 4096, DefaultHostAllocator()).value();
    EXPECT_FALSE(c.reused());
    EXPECT_NE(c.pool(), first);
  }
  const uint64_t before = HostBufferAllocations();
  {
    StagingLease d = StagingLease::Acquire(2, 8192, DefaultHostAllocator()).value();
    EXPECT_EQ(d.pool(), first);
  }
  EXPECT_EQ(HostBufferAllocations(), before) << "the spare was not reused";
  BufferPool* larger = nullptr;
  {
    // More buffers than the spare holds: a new pool, which replaces the spare when it ends.
    StagingLease e = StagingLease::Acquire(4, 8192, DefaultHostAllocator()).value();
    EXPECT_FALSE(e.reused());
    larger = e.pool();
  }
  {
    StagingLease f = StagingLease::Acquire(2, 8192, DefaultHostAllocator()).value();
    EXPECT_EQ(f.pool(), larger);
  }
  {
    // Asked for more buffers than the spare (4 of 8192) but content with as few as 4: it serves;
    // content with 2 of 16384: it does not (its buffers are too small).
    StagingLease f = StagingLease::Acquire(16, 4096, DefaultHostAllocator(), true, 4).value();
    EXPECT_TRUE(f.reused());
    EXPECT_EQ(f.pool(), larger);
    StagingLease g = StagingLease::Acquire(4, 16384, DefaultHostAllocator(), true, 2).value();
    EXPECT_FALSE(g.reused());
  }
  {
    StagingLease f = StagingLease::Acquire(4, 8192, DefaultHostAllocator()).value();
    larger = f.pool();  // the 4 x 16384 pool became the spare: the larger
    EXPECT_EQ(f.pool()->buffer_bytes(), 16384u);
  }
  {
    // keep = false: a pool of its own, and the spare is left alone.
    StagingLease g = StagingLease::Acquire(1, 4096, DefaultHostAllocator(), false).value();
    EXPECT_FALSE(g.reused());
    EXPECT_NE(g.pool(), larger);
  }
  {
    // Another allocator's memory (pinned, in CUDA builds) is never handed out for this one.
    HostAllocator other = DefaultHostAllocator();
    other.release = [](void* p) { std::free(p); };
    StagingLease h = StagingLease::Acquire(1, 4096, other).value();
    EXPECT_FALSE(h.reused());
  }
  ReleaseSpareStaging();
}

// A load's read ahead and its pipeline each keep a spare: neither replaces the other's.
TEST(StagingLease, EachUseKeepsItsOwnSpare) {
  ReleaseSpareStaging();
  BufferPool* pipeline = nullptr;
  BufferPool* ahead = nullptr;
  {
    StagingLease p = StagingLease::Acquire(8, 8192, DefaultHostAllocator()).value();
    StagingLease a = StagingLease::Acquire(1, 65536, DefaultHostAllocator(), true, 1, StagingUse::kReadAhead).value();
    pipeline = p.pool();
    ahead = a.pool();
  }
  const uint64_t before = HostBufferAllocations();
  for (int load = 0; load < 3; ++load) {
    StagingLease a = StagingLease::Acquire(1, 40000, DefaultHostAllocator(), true, 1, StagingUse::kReadAhead).value();
    StagingLease p = StagingLease::Acquire(8, 8192, DefaultHostAllocator()).value();
    EXPECT_EQ(a.pool(), ahead) << "load " << load;
    EXPECT_EQ(p.pool(), pipeline) << "load " << load;
  }
  EXPECT_EQ(HostBufferAllocations(), before);
  ReleaseSpareStaging();  // both
  StagingLease a = StagingLease::Acquire(1, 4096, DefaultHostAllocator(), true, 1, StagingUse::kReadAhead).value();
  StagingLease p = StagingLease::Acquire(1, 4096, DefaultHostAllocator()).value();
  EXPECT_FALSE(a.reused());
  EXPECT_FALSE(p.reused());
}

// Entries of `count` sizes from 1 to a few thousand bytes plus one of 3 MiB, bytes from `seed`.
struct State {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<uint8_t>> bytes;
  State(const std::string& seed, int count, uint8_t poison = 0, bool fill = true) {
    for (int i = 0; i <= count; ++i) {
      names.push_back("t" + std::to_string(i));
      shapes.push_back(i == count ? Shape{3 << 20} : Shape{1 + (i * 997) % 3000});
      bytes.push_back(fill ? testing::PieceBytes(seed + names.back(), DType::kUInt8, shapes.back(), Layout::Whole())
                           : std::vector<uint8_t>(static_cast<size_t>(shapes.back()[0]), poison));
    }
  }
  ShardedState Sharded() {
    ShardedState state;
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_TRUE(state.AddTensor(names[i], DType::kUInt8, shapes[i], Layout::Whole(), bytes[i].data()).ok());
    }
    return state;
  }
};

TEST(StagingLease, RepeatedLoadsReuseStagingAndSeeOnlyTheirOwnBytes) {
  ReleaseSpareStaging();
  testing::TempDir dir;
  auto comm = CreateSingleProcessCommunicator();
  const std::string a = JoinPath(dir.path(), "a"), b = JoinPath(dir.path(), "b");
  State saved_a("a", 600), saved_b("b", 600);
  ASSERT_TRUE(Save(*comm, a, 1, saved_a.Sharded()).ok());
  ASSERT_TRUE(Save(*comm, b, 1, saved_b.Sharded()).ok());
  auto load = [&](const std::string& root, State& into) {
    ShardedState targets = into.Sharded();
    Result<LoadReport> report = Load(*comm, root, targets);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
  };
  State first(" ", 600, 0xCD, false);
  load(a, first);
  EXPECT_EQ(first.bytes, saved_a.bytes);
  // The second load's staging buffers still hold the first's bytes: every target byte must
  // come from its own checkpoint, and no staging memory is allocated again (only the one
  // buffer of checksum-table pages each load reads).
  for (int round = 0; round < 2; ++round) {
    const uint64_t before = HostBufferAllocations();
    State got(" ", 600, 0xCD, false);
    load(round == 0 ? b : a, got);
    EXPECT_LE(HostBufferAllocations() - before, 1u) << "staging allocated again";
    for (size_t i = 0; i < got.bytes.size(); ++i) {
      ASSERT_EQ(got.bytes[i], (round == 0 ? saved_b : saved_a).bytes[i]) << got.names[i] << " round " << round;
    }
  }
  // With keep_staging false a load frees what it allocated and leaves the spare as it was.
  LoadOptions fresh;
  fresh.keep_staging = false;
  State got(" ", 600, 0xCD, false);
  ShardedState targets = got.Sharded();
  const uint64_t before = HostBufferAllocations();
  ASSERT_TRUE(Load(*comm, b, targets, fresh).ok());
  EXPECT_GT(HostBufferAllocations() - before, 1u);
  EXPECT_EQ(got.bytes, saved_b.bytes);
  ReleaseSpareStaging();
}

}  // namespace
}  // namespace shardckpt
