#include "shardckpt/engine/model/manifest_wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "shardckpt/engine/model/wire.h"
#include "shardckpt/io/failpoint.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

// Every field a manifest has, each with a value that differs from its default; values at the
// edges of what the variable-length integers hold.
Manifest Everything() {
  Manifest m;
  m.format_minor = 1;
  m.step = -7;
  m.world_size = 3;
  m.created = CreationInfo{"2026-12-01T07:00:00Z", "0.9.0", "2.15.0", 2, "abc123", {{"run", "demo"}, {"k", ""}}};
  m.metrics = {{"loss", 1.25}, {"acc", -0.0}, {"tiny", std::numeric_limits<double>::denorm_min()}};
  m.files.push_back(FileRecord{"rank-00000.bin", 3 * 4096 + 4096, 3 * 4096, {0x1234, UINT64_MAX}, true});
  m.files.push_back(FileRecord{"__1_0.distcp", 999, 999, {}, false});
  EntryRecord w{"model.w", DType::kFloat32, {4, 8}, {}};
  w.chunks.push_back(ChunkRecord{0, 0, 64, Layout::FlatRange(0, 16)});
  w.chunks.push_back(ChunkRecord{1, 12345678901234ull, 64, Layout::FlatRange(16, 32)});
  m.entries.push_back(w);
  EntryRecord b{"model.b\xc3\xa9", DType::kComplex128, {2, 3, 1, 1, 5}, {}};
  b.chunks.push_back(ChunkRecord{UINT32_MAX, UINT64_MAX, 12, Layout::Box({0, -1, 0, 0, 0}, {2, 3, 1, 1, INT64_MAX})});
  b.chunks.push_back(ChunkRecord{0, 4096, 12, Layout::Whole()});
  m.entries.push_back(b);
  m.entries.push_back(EntryRecord{"step", DType::kInt64, {}, {ChunkRecord{0, 8192, 8, Layout::Box({}, {})}}});
  m.entries.push_back(EntryRecord{"empty", DType::kUInt8, {0}, {}});
  m.blobs.push_back(BlobRecord{"rng", BlobScope::kPerRank, 2, 1, 8, 16});
  m.blobs.push_back(BlobRecord{"config", BlobScope::kGlobal, 0, 0, 0, UINT64_MAX});
  return m;
}

TEST(ManifestMessage, CarriesEveryField) {
  const Manifest m = Everything();
  const std::string message = EncodeManifestMessage(m);
  Result<Manifest> back = DecodeManifestMessage(message, "ckpt/manifest.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->format_major, m.format_major);
  EXPECT_EQ(back->format_minor, 1);
  EXPECT_EQ(back->step, -7);
  EXPECT_EQ(back->world_size, 3);
  EXPECT_EQ(back->created.time, m.created.time);
  EXPECT_EQ(back->created.shardckpt_version, "0.9.0");
  EXPECT_EQ(back->created.torch_version, "2.15.0");
  EXPECT_EQ(back->created.hosts, 2);
  EXPECT_EQ(back->created.git_commit, "abc123");
  EXPECT_EQ(back->created.user, m.created.user);
  ASSERT_EQ(back->metrics.size(), 3u);
  EXPECT_EQ(back->metrics.at("loss"), 1.25);
  EXPECT_TRUE(std::signbit(back->metrics.at("acc")));
  EXPECT_EQ(back->metrics.at("tiny"), std::numeric_limits<double>::denorm_min());
  ASSERT_EQ(back->files.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->files[i].name, m.files[i].name);
    EXPECT_EQ(back->files[i].size, m.files[i].size);
    EXPECT_EQ(back->files[i].table_offset, m.files[i].table_offset);
    EXPECT_EQ(back->files[i].table_page_sums, m.files[i].table_page_sums);
    EXPECT_EQ(back->files[i].checksums, m.files[i].checksums);
  }
  ASSERT_EQ(back->entries.size(), m.entries.size());
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& a = m.entries[i];
    const EntryRecord& e = back->entries[i];
    EXPECT_EQ(e.name, a.name);
    EXPECT_EQ(e.dtype, a.dtype);
    EXPECT_EQ(e.shape, a.shape);
    ASSERT_EQ(e.chunks.size(), a.chunks.size()) << a.name;
    for (size_t k = 0; k < a.chunks.size(); ++k) {
      EXPECT_EQ(e.chunks[k].file, a.chunks[k].file);
      EXPECT_EQ(e.chunks[k].offset, a.chunks[k].offset);
      EXPECT_EQ(e.chunks[k].bytes, a.chunks[k].bytes);
      EXPECT_EQ(e.chunks[k].layout, a.chunks[k].layout) << a.name << " chunk " << k;
    }
  }
  ASSERT_EQ(back->blobs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->blobs[i].name, m.blobs[i].name);
    EXPECT_EQ(back->blobs[i].scope, m.blobs[i].scope);
    EXPECT_EQ(back->blobs[i].rank, m.blobs[i].rank);
    EXPECT_EQ(back->blobs[i].file, m.blobs[i].file);
    EXPECT_EQ(back->blobs[i].offset, m.blobs[i].offset);
    EXPECT_EQ(back->blobs[i].bytes, m.blobs[i].bytes);
  }
}

// The integers under the message: the largest value, one bit past it, and counts checked against
// the bytes left at the size of the smallest item.
TEST(ManifestMessage, IntegersAndCountsStayInRange) {
  const std::string max = std::string(9, '\xff') + '\x01';
  WireReader largest(max);
  EXPECT_EQ(largest.Var(), UINT64_MAX);
  EXPECT_TRUE(largest.ok() && largest.done());
  const std::string over = std::string(9, '\xff') + '\x02';
  WireReader past(over);
  past.Var();
  EXPECT_FALSE(past.ok());

  const std::string three_then_ten = std::string(1, '\x03') + std::string(10, '\0');
  WireReader bytes(three_then_ten);
  EXPECT_EQ(bytes.VarCount(1), 3u);
  WireReader chunks(three_then_ten);
  EXPECT_EQ(chunks.VarCount(4), 0u);  // three items of four bytes do not fit in ten
  EXPECT_FALSE(chunks.ok());
}

// Small numbers take one byte: a flat-range chunk of small offsets is six bytes (file, offset,
// bytes, kind, begin, end), where JSON text takes about 20 and fixed 8-byte fields 48.
TEST(ManifestMessage, SmallNumbersTakeOneByte) {
  Manifest m;
  m.entries.push_back(EntryRecord{"w", DType::kFloat32, {32}, {ChunkRecord{0, 0, 64, Layout::FlatRange(0, 16)}}});
  const size_t one = EncodeManifestMessage(m).size();
  m.entries[0].chunks.push_back(ChunkRecord{1, 64, 64, Layout::FlatRange(16, 32)});
  EXPECT_EQ(EncodeManifestMessage(m).size(), one + 6);
}

// A large message's chunk lists share one arena (record_arena.h); a small one's stay on the heap,
// where a 2 MiB block would be mostly unused.
TEST(ManifestMessage, LargeMessagesDecodeIntoAnArena) {
  Manifest m;
  for (int i = 0; i < 30000; ++i) {
    EntryRecord e{"layers." + std::to_string(i) + ".weight", DType::kFloat32, {64, 8}, {}};
    for (int64_t r = 0; r < 4; ++r) {
      e.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), 4096u * i, 512, Layout::Box({16 * r, 0}, {16, 8})});
    }
    m.entries.push_back(e);
  }
  const std::string message = EncodeManifestMessage(m);
  ASSERT_GE(message.size(), kArenaMinTextBytes);
  Result<Manifest> back = DecodeManifestMessage(message, "m");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->entries.size(), 30000u);
  const std::shared_ptr<RecordArena> arena = back->entries[0].chunks.get_allocator().arena();
  ASSERT_NE(arena, nullptr);
  for (const EntryRecord& e : back->entries) ASSERT_EQ(e.chunks.get_allocator().arena(), arena) << e.name;
  EXPECT_EQ(back->entries[29999].chunks[3].layout, Layout::Box({48, 0}, {16, 8}));
  EXPECT_EQ(back->entries[29999].chunks[3].offset, 4096u * 29999);
  // Blocks double: what is mapped stays under twice what is used, plus the first block.
  EXPECT_LT(arena->ReservedBytes(), 2 * 120000 * sizeof(ChunkRecord) + (size_t{2} << 20));

  Result<Manifest> small = DecodeManifestMessage(EncodeManifestMessage(Everything()), "m");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->entries[0].chunks.get_allocator().arena(), nullptr);

  // No memory for the arena: a Status naming the origin, as every rank must hear of it, not a
  // throw. The JSON decoder does the same.
  Result<std::string> text = EncodeManifest(*back);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  ReleaseCachedArenaBlocks();
  ASSERT_TRUE(SetFailpoints("arena.block=EIO").ok());
  Result<Manifest> starved = DecodeManifestMessage(message, "ckpt/step-7/manifest.json");
  Result<Manifest> starved_text = DecodeManifest(*text, "ckpt/step-7/manifest.json");
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_FALSE(starved.ok());
  EXPECT_THAT(starved.status().message(), HasSubstr("ckpt/step-7/manifest.json: out of memory decoding the manifest"));
  ASSERT_FALSE(starved_text.ok());
  EXPECT_THAT(starved_text.status().message(), HasSubstr("ckpt/step-7/manifest.json: out of memory decoding the manifest"));
  EXPECT_TRUE(DecodeManifestMessage(message, "m").ok());
}

// Whatever a cut or changed message holds, reading it is refused with the origin named or gives
// some manifest; it never reads past the message or allocates by a count it claims.
TEST(ManifestMessage, RefusesCutAndDamagedMessages) {
  const std::string message = EncodeManifestMessage(Everything());
  for (size_t n = 0; n < message.size(); ++n) {
    Result<Manifest> cut = DecodeManifestMessage(message.substr(0, n), "ckpt/manifest.json");
    ASSERT_FALSE(cut.ok()) << n;
    EXPECT_EQ(cut.status().code(), Code::kDataLoss);
    EXPECT_THAT(cut.status().message(), HasSubstr("ckpt/manifest.json: the manifest another rank sent is malformed"));
  }
  EXPECT_FALSE(DecodeManifestMessage(message + '\0', "m").ok());
  std::string other_version = message;
  other_version[0] = 2;
  EXPECT_FALSE(DecodeManifestMessage(other_version, "m").ok());
  // A count claiming more items than bytes are left.
  std::string huge = message.substr(0, 1);
  for (int i = 0; i < 9; ++i) huge.push_back('\xff');
  huge.push_back('\x01');
  EXPECT_FALSE(DecodeManifestMessage(huge, "m").ok());

  std::mt19937 rng(3);
  for (int round = 0; round < 20000; ++round) {
    std::string damaged = message;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) damaged[rng() % damaged.size()] = static_cast<char>(rng());
    Result<Manifest> read = DecodeManifestMessage(damaged, "m");
    if (!read.ok()) {
      EXPECT_EQ(read.status().code(), Code::kDataLoss);
    }
  }
}

}  // namespace
}  // namespace shardckpt
