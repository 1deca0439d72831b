#include "shardckpt/engine/model/read_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <tuple>

#include "shardckpt/engine/model/entry_wants.h"
#include "shardckpt/io/checksum.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::ElementsAre;

struct Extent {
  uint32_t file;
  uint64_t offset, length;
  size_t copies;
  bool operator==(const Extent& o) const {
    return file == o.file && offset == o.offset && length == o.length && copies == o.copies;
  }
};
std::ostream& operator<<(std::ostream& out, const Extent& e) {
  return out << "{file " << e.file << " @" << e.offset << " +" << e.length << " copies " << e.copies << "}";
}
std::vector<Extent> Extents(const ReadPlan& plan) {
  std::vector<Extent> out;
  for (const ReadExtent& e : plan.extents) out.push_back(Extent{e.file, e.offset, e.length, e.copy_count});
  return out;
}

// One entry [rows, cols] float32 saved as row blocks of `rows_per_file`, one file each.
Manifest RowSaved(int64_t rows, int64_t cols, int64_t rows_per_file) {
  Manifest m;
  EntryRecord e{"w", DType::kFloat32, {rows, cols}, {}};
  for (int64_t r = 0, f = 0; r < rows; r += rows_per_file, ++f) {
    int64_t n = std::min(rows_per_file, rows - r);
    uint64_t bytes = static_cast<uint64_t>(n * cols * 4);
    e.chunks.push_back(ChunkRecord{static_cast<uint32_t>(f), 0, bytes, Layout::Box({r, 0}, {n, cols})});
    uint64_t table = AlignUp(bytes, kBlockSize);
    m.files.push_back(FileRecord{"f" + std::to_string(f), DataFileSize(table), table,
                                 std::vector<uint64_t>(TablePages(table), 0)});
  }
  m.entries.push_back(e);
  return m;
}

ReadPlan Plan(const Manifest& m, const std::vector<WantedPiece>& wanted, ReadPlanOptions options = {}) {
  ChunkIndex index(&m);
  std::vector<CopyRequest> copies;
  PlanPieceCopies(m, index, wanted, &copies);
  return CoalesceReads(std::move(copies), options);
}

TEST(ReadPlan, SameLayoutReadsEachChunkOnceWhole) {
  // [1024, 1024] float32 in 4 files of 256 rows (1 MiB each); wanting row block 1 reads file 1
  // whole, as one extent and one copy.
  Manifest m = RowSaved(1024, 1024, 256);
  ReadPlan plan = Plan(m, {WantedPiece{0, Layout::Box({256, 0}, {256, 1024}), 0}});
  EXPECT_THAT(Extents(plan), ElementsAre(Extent{1, 0, 1 << 20, 1}));
  EXPECT_EQ(plan.bytes_read, plan.bytes_wanted);
}

TEST(ReadPlan, RowsAcrossTwoFilesReadOnlyTheNeededRows) {
  // Rows 200..312: the last 56 rows of file 0 (offset 200*4096) and the first 56 of file 1.
  Manifest m = RowSaved(1024, 1024, 256);
  ReadPlan plan = Plan(m, {WantedPiece{0, Layout::Box({200, 0}, {112, 1024}), 0}});
  EXPECT_THAT(Extents(plan), ElementsAre(Extent{0, 200 * 4096, 56 * 4096, 1}, Extent{1, 0, 56 * 4096, 1}));
  EXPECT_EQ(plan.bytes_read, plan.bytes_wanted);
}

TEST(ReadPlan, ColumnHalfOfWideRowsReadsHalfTheBytes) {
  // Rows of 2048 floats = 8 KiB; the right half of every row is the second 4 KiB block of it, so
  // each row is its own 4 KiB extent (no merging across the unwanted left halves).
  Manifest m = RowSaved(16, 2048, 16);
  ReadPlan plan = Plan(m, {WantedPiece{0, Layout::Box({0, 1024}, {16, 1024}), 0}});
  ASSERT_EQ(plan.extents.size(), 16u);
  EXPECT_EQ(plan.extents[0].offset, 4096u);
  EXPECT_EQ(plan.extents[15].offset, 15u * 8192 + 4096);
  EXPECT_EQ(plan.bytes_read, plan.bytes_wanted);
  // With a gap allowance of one block the reads merge into one extent covering 31 blocks.
  ReadPlan merged = Plan(m, {WantedPiece{0, Layout::Box({0, 1024}, {16, 1024}), 0}}, {4096, 8 << 20});
  EXPECT_THAT(Extents(merged), ElementsAre(Extent{0, 4096, 31 * 4096, 16}));
}

TEST(ReadPlan, LargeExtentsAreCutAndCopiesSplitAtTheCuts) {
  // One 1 MiB chunk read whole with 256 KiB staging buffers: 4 extents, each with a quarter.
  Manifest m = RowSaved(256, 1024, 256);
  ReadPlan plan = Plan(m, {WantedPiece{0, Layout::Whole(), 7}}, {0, 256 << 10});
  ASSERT_EQ(plan.extents.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(plan.extents[i].copy_count, 1u);
    const ScatterCopy& c = plan.copies[plan.extents[i].first_copy];
    EXPECT_EQ(c.target, 7u);
    EXPECT_EQ(c.target_offset, i * (256u << 10));
    EXPECT_EQ(c.length, 256u << 10);
  }
}

// Copies that overlap (one block wanted by two targets) and one that spans a cut: each cut
// extent lists its own copies, in the order the range had them, and nothing else.
TEST(ReadPlan, CutExtentsKeepOverlappingCopiesInOrder) {
  const uint64_t b = kBlockSize;
  std::vector<CopyRequest> copies = {{0, 0, 3 * b, 0, 0}, {0, b, b, 1, 0}, {0, 2 * b + 8, 16, 2, 0}, {1, 0, 8, 3, 0}};
  ReadPlan plan = CoalesceReads(copies, {0, 2 * b});
  EXPECT_THAT(Extents(plan), ElementsAre(Extent{0, 0, 2 * b, 2}, Extent{0, 2 * b, b, 2}, Extent{1, 0, b, 1}));
  struct Copy {
    uint64_t at, length;
    uint32_t target;
    uint64_t target_offset;
    bool operator==(const Copy& o) const {
      return at == o.at && length == o.length && target == o.target && target_offset == o.target_offset;
    }
  };
  std::vector<Copy> got;
  for (const ScatterCopy& c : plan.copies) got.push_back(Copy{c.extent_offset, c.length, c.target, c.target_offset});
  EXPECT_EQ(got, (std::vector<Copy>{{0, 2 * b, 0, 0}, {b, b, 1, 0}, {0, b, 0, 2 * b}, {8, 16, 2, 0}, {0, 8, 3, 0}}));
  EXPECT_EQ(plan.bytes_wanted, 4 * b + 24);
  EXPECT_EQ(plan.bytes_read, 4 * b);
}

// Random copies (overlapping, repeated, empty, across two files), any merge gap and cut: every
// copy comes back whole, as parts that tile it, each inside its extent and at its file offset.
TEST(ReadPlanProperty, CutExtentsTileEveryCopy) {
  std::mt19937_64 rng(20261203);
  const uint64_t b = kBlockSize;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<CopyRequest> copies;
    const int n = 1 + static_cast<int>(rng() % 12);
    uint64_t wanted = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t offset = rng() % (16 * b), length = rng() % 3 == 0 ? 0 : 1 + rng() % (6 * b);
      copies.push_back(CopyRequest{static_cast<uint32_t>(rng() % 2), offset, length, static_cast<uint32_t>(i), 0});
      wanted += length;
    }
    const ReadPlanOptions options{(rng() % 3) * b, b * (1 + rng() % 4) + (rng() % 2) * 100};
    const ReadPlan plan = CoalesceReads(copies, options);
    EXPECT_EQ(plan.bytes_wanted, wanted);
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> parts(n);  // target offset, length
    size_t listed = 0;
    for (size_t x = 0; x < plan.extents.size(); ++x) {
      const ReadExtent& e = plan.extents[x];
      ASSERT_EQ(e.offset % b, 0u);
      ASSERT_LE(e.length, AlignDown(options.max_extent, b));
      ASSERT_EQ(e.first_copy, listed) << "trial " << trial;  // each extent's copies follow the last's
      listed += e.copy_count;
      for (size_t k = e.first_copy; k < e.first_copy + e.copy_count; ++k) {
        const ScatterCopy& c = plan.copies[k];
        ASSERT_LE(c.extent_offset + c.length, e.length) << "trial " << trial;
        const CopyRequest& asked = copies[c.target];
        ASSERT_EQ(e.file, asked.file);
        ASSERT_EQ(e.offset + c.extent_offset, asked.file_offset + c.target_offset) << "trial " << trial;
        parts[c.target].emplace_back(c.target_offset, c.length);
      }
    }
    EXPECT_EQ(listed, plan.copies.size());
    for (int i = 0; i < n; ++i) {
      std::sort(parts[i].begin(), parts[i].end());
      uint64_t at = 0;
      for (auto [offset, length] : parts[i]) {
        ASSERT_EQ(offset, at) << "trial " << trial << " copy " << i;
        at += length;
      }
      ASSERT_EQ(at, copies[i].length) << "trial " << trial << " copy " << i;
    }
  }
}

TEST(PlanOptionsFor, CutsExtentsOnlyForMemoryBackedFolders) {
  struct Case {
    uint64_t max_extent, memory_cut;
    bool memory_backed;
    uint64_t planned;
  };
  const Case cases[] = {
      {8u << 20, 256u << 10, false, 8u << 20},   // storage: as asked
      {8u << 20, 256u << 10, true, 256u << 10},  // tmpfs: cut
      {64u << 10, 256u << 10, true, 64u << 10},  // asked smaller still: kept
      {8u << 20, 0, true, 8u << 20},             // the cut turned off
  };
  for (const Case& c : cases) {
    ReadPlanOptions asked;
    asked.merge_gap = 4096;
    asked.max_extent = c.max_extent;
    asked.memory_backed_max_extent = c.memory_cut;
    const ReadPlanOptions planned = PlanOptionsFor(asked, c.memory_backed);
    EXPECT_EQ(planned.max_extent, c.planned) << c.max_extent << " " << c.memory_cut << " " << c.memory_backed;
    EXPECT_EQ(planned.merge_gap, 4096u);
  }
}

// ---- Property test: random shapes, random saved layouts at N, random wanted layouts at M. ----

// Many small chunks packed into shared blocks (format 1.1), a reader wanting every third one
// whole: each chunk is one copy (its exact layout, no region index), and each block holding a
// wanted byte is read exactly once however many wanted pieces share it: the read amplification
// left is that of whole blocks, which O_DIRECT and the per-block checksums need.
TEST(ReadPlan, PackedPiecesSharingBlocksReadEachBlockOnce) {
  Manifest m;
  uint64_t at = 0;
  std::set<uint64_t> blocks;  // blocks holding a wanted byte
  std::vector<WantedPiece> wanted;
  for (int i = 0; i < 3000; ++i) {
    const int64_t n = 1 + (i * 37) % 600;  // float32 elements: 4 B to 2.4 KiB
    EntryRecord e{"e" + std::to_string(i), DType::kFloat32, {n}, {}};
    e.chunks.push_back(ChunkRecord{0, at, static_cast<uint64_t>(n) * 4, Layout::Whole()});
    if (i % 3 == 0) {
      for (uint64_t b = at / kBlockSize; b <= (at + n * 4 - 1) / kBlockSize; ++b) blocks.insert(b);
      wanted.push_back(WantedPiece{static_cast<size_t>(i), Layout::Whole(), static_cast<uint32_t>(wanted.size())});
    }
    at += static_cast<uint64_t>(n) * 4;
    m.entries.push_back(e);
  }
  const uint64_t table = AlignUp(at, kBlockSize);
  m.files.push_back(FileRecord{"f0", DataFileSize(table), table, std::vector<uint64_t>(TablePages(table), 0)});
  ChunkIndex index(&m);
  std::vector<CopyRequest> copies;
  PlanPieceCopies(m, index, wanted, &copies);
  ASSERT_EQ(copies.size(), wanted.size());
  for (size_t k = 0; k < copies.size(); ++k) {
    const ChunkRecord& chunk = m.entries[wanted[k].entry].chunks[0];
    EXPECT_EQ(copies[k].file_offset, chunk.offset);
    EXPECT_EQ(copies[k].length, chunk.bytes);
    EXPECT_EQ(copies[k].target_offset, 0u);
  }
  ReadPlan plan = CoalesceReads(copies, ReadPlanOptions{});
  EXPECT_EQ(plan.bytes_read, blocks.size() * kBlockSize);
  std::set<uint64_t> read;
  for (const ReadExtent& e : plan.extents) {
    for (uint64_t b = e.offset / kBlockSize; b < (e.offset + e.length) / kBlockSize; ++b) {
      EXPECT_TRUE(read.insert(b).second) << "block " << b << " read twice";
    }
  }
  EXPECT_EQ(read, blocks);
}

Layout RandomLayout(std::mt19937& rng, const Shape& shape, int parts, int index, int family) {
  switch (family) {
    case 0: return FlatShardLayout(shape, parts, index);
    case 1:
      if (!shape.empty()) return ChunkLayout(shape, static_cast<int>(rng() % shape.size()), parts, index);
      return index == 0 ? Layout::Whole() : Layout::FlatRange(1, 1);
    default: {
      if (shape.size() < 2) return FlatShardLayout(shape, parts, index);
      // A p x q grid over dims 0 and 1 (q = parts / p), torch.chunk style on each.
      int p = (parts % 2 == 0) ? 2 : 1, q = parts / p;
      Layout rows = ChunkLayout(shape, 0, p, index / q);
      Layout cols = ChunkLayout(shape, 1, q, index % q);
      rows.offsets[1] = cols.offsets[1];
      rows.sizes[1] = cols.sizes[1];
      return rows;
    }
  }
}

TEST(ReadPlanProperty, AnyLayoutAtNLoadsIntoAnyLayoutAtM) {
  std::mt19937 rng(20261129);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8, DType::kFloat64};
  for (int trial = 0; trial < 300; ++trial) {
    Shape shape;
    int dims = static_cast<int>(rng() % 4);
    for (int d = 0; d < dims; ++d) shape.push_back(static_cast<int64_t>(rng() % 40));
    if (rng() % 8 == 0 && dims > 0) shape.back() = 2048 + rng() % 100;  // rows wider than a block
    DType dtype = dtypes[rng() % 4];
    int n = 1 + rng() % 8, m = 1 + rng() % 8;
    int saved_family = rng() % 3, wanted_family = rng() % 4;
    std::string name = "t" + std::to_string(trial);
    // Saved: one file per rank; chunks at 4096-aligned offsets (one chunk per file here).
    Manifest manifest;
    EntryRecord entry{name, dtype, shape, {}};
    std::vector<std::vector<uint8_t>> files;
    for (int r = 0; r < n; ++r) {
      Layout layout = RandomLayout(rng, shape, n, r, saved_family);
      if (saved_family == 1 && !shape.empty()) layout = ChunkLayout(shape, 0, n, r);
      std::vector<uint8_t> bytes = testing::PieceBytes(name, dtype, shape, layout);
      uint64_t table = AlignUp(bytes.size() + 4096, kBlockSize);  // chunk at offset 4096
      std::vector<uint8_t> file(table, 0xEE);
      if (!bytes.empty()) std::memcpy(file.data() + 4096, bytes.data(), bytes.size());
      files.push_back(file);
      entry.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), 4096, bytes.size(), layout});
      manifest.files.push_back(FileRecord{"r" + std::to_string(r), DataFileSize(table), table,
                                          std::vector<uint64_t>(TablePages(table), 0)});
    }
    manifest.entries.push_back(entry);
    ASSERT_TRUE(ValidateManifest(manifest).ok()) << ValidateManifest(manifest).ToString();
    ChunkIndex index(&manifest);
    for (int r = 0; r < m; ++r) {
      Layout want = wanted_family == 3 ? Layout::Whole() : RandomLayout(rng, shape, m, r, wanted_family);
      std::vector<CopyRequest> copies;
      PlanPieceCopies(manifest, index, {WantedPiece{0, want, 0}}, &copies);
      ReadPlanOptions options{(rng() % 2) * 4096, kBlockSize * (1 + rng() % 4)};
      ReadPlan plan = CoalesceReads(copies, options);
      std::vector<uint8_t> expected = testing::PieceBytes(name, dtype, shape, want);
      std::vector<uint8_t> got(expected.size(), 0);
      for (const ReadExtent& e : plan.extents) {
        ASSERT_EQ(e.offset % kBlockSize, 0u);
        ASSERT_LE(e.length, options.max_extent);
        for (size_t k = e.first_copy; k < e.first_copy + e.copy_count; ++k) {
          const ScatterCopy& c = plan.copies[k];
          ASSERT_LE(c.extent_offset + c.length, e.length);
          std::memcpy(got.data() + c.target_offset, files[e.file].data() + e.offset + c.extent_offset, c.length);
        }
      }
      ASSERT_EQ(got, expected) << "trial " << trial << " shape " << ShapeString(shape) << " N=" << n
                               << " M=" << m << " want " << want.ToString();
      EXPECT_EQ(plan.bytes_wanted, expected.size());
      EXPECT_GE(plan.bytes_read, plan.bytes_wanted);
    }
  }
}

// Load step 2: each rank's pieces per entry, all-gathered, decide who loads what.
TEST(EntryWantsTest, CombinesEveryRanksPieces) {
  struct Piece { int rank; size_t entry; bool whole; bool on_device; };
  struct Case { const char* what; std::vector<Piece> pieces; bool any, whole_by_all, on_device_everywhere; };
  const Case cases[] = {
      {"nobody", {}, false, false, false},
      {"both whole, host", {{0, 0, true, false}, {1, 0, true, false}}, true, true, false},
      {"both whole, device", {{0, 0, true, true}, {1, 0, true, true}}, true, true, true},
      {"one rank a part", {{0, 0, true, true}, {1, 0, false, true}}, true, false, false},
      {"a rank whole and a part", {{0, 0, true, false}, {0, 0, false, false}, {1, 0, true, false}}, true, false, false},
      {"one rank only", {{1, 0, true, true}}, true, false, false},
      // The first whole piece is the one a broadcast fills: a later device piece does not count.
      {"host then device", {{0, 0, true, false}, {0, 0, true, true}, {1, 0, true, true}}, true, true, false},
      {"device then host", {{0, 0, true, true}, {0, 0, true, false}, {1, 0, true, true}}, true, true, true},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<EntryWant>> ranks(2, std::vector<EntryWant>(2));
    for (const Piece& p : c.pieces) ranks[p.rank][p.entry].Add(p.whole, p.on_device);
    std::vector<std::string> wire;
    for (const auto& r : ranks) wire.push_back(EncodeEntryWants(r));
    for (const auto& r : ranks) {
      for (const EntryWant& w : r) {
        const EntryWant back = EntryWant::Decode(w.Encode());
        EXPECT_EQ(std::make_tuple(back.wanted, back.whole, back.part, back.whole_on_device),
                  std::make_tuple(w.wanted, w.whole, w.part, w.whole_on_device)) << c.what;
      }
    }
    const AllRanksWant all = CombineEntryWants(wire, 2);
    EXPECT_EQ(all.any[0], c.any) << c.what;
    EXPECT_EQ(all.whole_by_all[0] && all.any[0], c.whole_by_all) << c.what;
    EXPECT_EQ(all.whole_on_device_everywhere[0], c.on_device_everywhere) << c.what;
    EXPECT_FALSE(all.any[1]) << c.what;  // entry 1: no piece on any rank
  }
}

}  // namespace
}  // namespace shardckpt
