#include "shardckpt/engine/model/record_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {
namespace {

TEST(RecordArena, HandsOutAlignedDisjointMemoryInGrowingBlocks) {
  RecordArena arena;
  EXPECT_EQ(arena.ReservedBytes(), 0u);  // nothing until the first request
  std::vector<std::pair<char*, size_t>> given;
  size_t asked = 0;
  for (size_t i = 0; i < 3000; ++i) {
    const size_t bytes = 1 + (i * 7919) % 9000;
    char* p = static_cast<char*>(arena.Allocate(bytes));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % alignof(std::max_align_t), 0u) << i;
    std::memset(p, static_cast<int>(i & 0xff), bytes);
    given.emplace_back(p, bytes);
    asked += bytes;
  }
  // Every byte still holds what its owner wrote: no two requests overlap.
  for (size_t i = 0; i < given.size(); ++i) {
    const auto [p, bytes] = given[i];
    ASSERT_EQ(std::count(p, p + bytes, static_cast<char>(i & 0xff)), static_cast<std::ptrdiff_t>(bytes)) << i;
  }
  // 13.5 MB asked: blocks of 2, 4, 8 MiB; less than twice what was asked is reserved.
  EXPECT_GE(arena.ReservedBytes(), asked);
  EXPECT_LT(arena.ReservedBytes(), 2 * asked);
  EXPECT_EQ(arena.ReservedBytes() % (size_t{2} << 20), 0u);
  // A request larger than the next block gets a block of its own size.
  const size_t before = arena.ReservedBytes();
  char* large = static_cast<char*>(arena.Allocate(size_t{100} << 20));
  large[(size_t{100} << 20) - 1] = 1;
  EXPECT_GE(arena.ReservedBytes(), before + (size_t{100} << 20));
}

// A finished arena's blocks serve the next arena (memory already faulted in); at most 64 MiB are
// kept, the rest freed.
TEST(RecordArena, TheNextArenaReusesTheBlocksOfTheLast) {
  constexpr size_t kMiB = size_t{1} << 20;
  ReleaseCachedArenaBlocks();
  ASSERT_EQ(RecordArenaCachedBytes(), 0u);
  void* first_block = nullptr;
  void* second_block = nullptr;
  {
    RecordArena arena;
    first_block = arena.Allocate(kMiB);       // the 2 MiB block
    second_block = arena.Allocate(3 * kMiB);  // the 4 MiB block
  }
  EXPECT_EQ(RecordArenaCachedBytes(), 6 * kMiB);
  {
    RecordArena arena;
    EXPECT_EQ(arena.Allocate(kMiB), first_block);
    EXPECT_EQ(arena.Allocate(3 * kMiB), second_block);
    EXPECT_EQ(RecordArenaCachedBytes(), 0u);
  }
  {
    RecordArena arena;
    arena.Allocate(kMiB);
    arena.Allocate(40 * kMiB);  // past the next size (4 MiB): a block of its own, not kept
  }
  EXPECT_EQ(RecordArenaCachedBytes(), 6 * kMiB);  // the 2 and 4 MiB blocks again, not the 40 MiB one
  {
    RecordArena arena;
    for (int i = 0; i < 12; ++i) arena.Allocate(kMiB + kMiB / 2);  // blocks of 2, 4, 8 and 16 MiB
    EXPECT_EQ(arena.ReservedBytes(), 30 * kMiB);
    for (int i = 0; i < 40; ++i) arena.Allocate(30 * kMiB);  // then 32, 64, 64, ... MiB
  }
  EXPECT_GT(RecordArenaCachedBytes(), 30 * kMiB);
  EXPECT_LE(RecordArenaCachedBytes(), size_t{64} << 20);
  ReleaseCachedArenaBlocks();
  EXPECT_EQ(RecordArenaCachedBytes(), 0u);
}

ChunkRecord Chunk(uint64_t offset) {
  ChunkRecord c;
  c.offset = offset;
  c.bytes = 4;
  c.layout = Layout::Box({static_cast<int64_t>(offset), 0}, {1, 4});
  return c;
}

TEST(ArenaAllocator, ListsKeepTheirArenaAndCopiesGoToTheHeap) {
  auto arena = std::make_shared<RecordArena>();
  std::weak_ptr<RecordArena> watch = arena;
  ChunkRecords in_arena({Chunk(1), Chunk(2), Chunk(3)}, ArenaAllocator<ChunkRecord>(arena));
  arena.reset();
  ASSERT_FALSE(watch.expired());  // the list holds it
  EXPECT_EQ(in_arena.get_allocator().arena(), watch.lock());

  // A copy is on the heap: it must not pin a decode's arena.
  ChunkRecords copy = in_arena;
  EXPECT_EQ(copy.get_allocator().arena(), nullptr);
  EXPECT_EQ(copy[2].layout, Chunk(3).layout);

  // A move takes the memory and the arena with it; so does a move into an existing list.
  const ChunkRecord* data = in_arena.data();
  ChunkRecords moved = std::move(in_arena);
  EXPECT_EQ(moved.data(), data);
  ChunkRecords assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), data);
  EXPECT_EQ(assigned.get_allocator().arena(), watch.lock());
  ASSERT_FALSE(watch.expired());

  // Growing in the arena keeps the values; the arena goes with the last list that holds it.
  for (uint64_t i = 4; i < 1000; ++i) assigned.push_back(Chunk(i));
  EXPECT_EQ(assigned[0].offset, 1u);
  EXPECT_EQ(assigned[998].layout, Chunk(999).layout);
  {
    EntryRecord e;
    e.chunks = std::move(assigned);
    std::vector<EntryRecord> entries;
    entries.push_back(std::move(e));
    entries.resize(100);  // the vector's regrowth moves the entry, list and arena together
    EXPECT_EQ(entries[0].chunks[500].offset, 501u);
    EXPECT_FALSE(watch.expired());
  }
  // A move copies the allocator, so the lists moved from hold the arena until they are given
  // another or are gone.
  EXPECT_FALSE(watch.expired());
  in_arena = ChunkRecords();
  moved = ChunkRecords();
  assigned = ChunkRecords();
  EXPECT_TRUE(watch.expired());
}

// A moved-from allocator still equals the original (containers other than vector free through
// it after a move).
TEST(ArenaAllocator, AMoveCopies) {
  ArenaAllocator<ChunkRecord> original(std::make_shared<RecordArena>());
  ArenaAllocator<ChunkRecord> moved_from = original;
  ArenaAllocator<ChunkRecord> moved_to = std::move(moved_from);
  EXPECT_EQ(moved_from, original);  // NOLINT(bugprone-use-after-move): what is tested
  EXPECT_EQ(moved_to, original);
  ArenaAllocator<ChunkRecord> assigned;
  assigned = std::move(moved_to);
  EXPECT_EQ(moved_to, original);  // NOLINT(bugprone-use-after-move)
}

TEST(ArenaAllocator, TheDefaultIsTheHeap) {
  ChunkRecords heap = {Chunk(7)};
  EXPECT_EQ(heap.get_allocator().arena(), nullptr);
  EXPECT_EQ(heap.get_allocator(), ChunkRecords().get_allocator());
  EXPECT_NE(heap.get_allocator(), ArenaAllocator<ChunkRecord>(std::make_shared<RecordArena>()));
}

}  // namespace
}  // namespace shardckpt
