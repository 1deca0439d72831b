// Packed chunks (format 1.1, engine/model/chunk_packing.h): where offsets go, which manifest
// version says so, and that a data file of packed chunks reads back through aligned, verified
// reads of the enclosing blocks.
#include "shardckpt/engine/model/chunk_packing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstring>
#include <functional>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/extent_reader.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/core/shard_writer.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct OffsetCase {
  uint64_t position, bytes, element_size;
  bool pack;
  uint64_t offset;
};

TEST(ChunkOffset, PacksSmallChunksAtTheirElementSizeAndLargeOnesOnBlocks) {
  const std::vector<OffsetCase> cases = {
      {0, 16, 4, true, 0},                           // the file's start is any chunk's
      {16, 4, 4, true, 16},                          // float32 after float32: no gap
      {18, 4, 4, true, 20},                          // after a bf16 tail: next multiple of 4
      {18, 2, 2, true, 18},                          // bf16: 2 is enough
      {13, 8, 8, true, 16},                          // float64 / int64
      {13, 5, 1, true, 13},                          // bytes and blobs: anywhere
      {13, 5, 0, true, 13},                          // no element size given: as bytes
      {4095, 8, 8, true, 4096},                      // crosses into the next block: fine
      {100, 4096, 4, true, 100},                     // a block's worth is still small
      {100, kPackBelowBytes - 4, 4, true, 100},      // just below the limit: packed
      {100, kPackBelowBytes, 4, true, 4096},         // at the limit: on a block
      {8192, kPackBelowBytes, 4, true, 8192},        // already on a block: no padding
      {100, 16, 4, false, 4096},                     // packing off: format 1.0
      {0, 16, 4, false, 0},
      {100, 0, 4, true, 4096},                       // empty: next boundary, never padded to
      {4096, 0, 4, true, 4096},
  };
  for (const OffsetCase& c : cases) {
    ChunkPacking packing;
    packing.pack = c.pack;
    EXPECT_EQ(ChunkOffset(c.position, c.bytes, c.element_size, packing), c.offset)
        << "position " << c.position << " bytes " << c.bytes << " element " << c.element_size << " pack " << c.pack;
  }
}

Manifest OneFile(uint64_t chunk_offset) {
  Manifest m;
  m.files.push_back(FileRecord{"rank-00000.bin", 2 * 4096, 4096, {0x1}});
  EntryRecord e{"model.bias", DType::kFloat32, {4}, {}};
  e.chunks.push_back(ChunkRecord{0, chunk_offset, 16, Layout::Whole()});
  m.entries.push_back(e);
  return m;
}

// The version a manifest carries is the lowest that describes it, and a 1.0 manifest keeps 1.0's
// promise: a reader refuses one whose offsets are off a block.
TEST(ChunkOffset, ManifestSaysOnePointOneOnlyWithPackedOffsets) {
  Result<Manifest> aligned = DecodeManifest(EncodeManifest(OneFile(0)).value(), "a/manifest.json");
  ASSERT_TRUE(aligned.ok()) << aligned.status().ToString();
  EXPECT_EQ(aligned->format_minor, 0);
  const std::string packed_text = EncodeManifest(OneFile(20)).value();
  EXPECT_THAT(packed_text, HasSubstr("\"format_version\": [1, 1]"));
  Result<Manifest> packed = DecodeManifest(packed_text, "p/manifest.json");
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_EQ(packed->format_minor, 1);
  EXPECT_EQ(packed->entries[0].chunks[0].offset, 20u);

  std::string text = CheckSeal(packed_text, "p").value();
  const std::string v11 = "\"format_version\": [1, 1]";
  text.replace(text.find(v11), v11.size(), "\"format_version\": [1, 0]");
  Result<Manifest> lying = DecodeManifest(SealManifestText(text), "old/manifest.json");
  ASSERT_FALSE(lying.ok());
  EXPECT_THAT(lying.status().message(), HasSubstr("entry 'model.bias' chunk 0 offset 20 is not 4096-aligned, as format 1.0 requires"));
  // Packed or not, a chunk must lie inside the data area.
  Result<Manifest> past = DecodeManifest(EncodeManifest(OneFile(4090)).value(), "p/manifest.json");
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(past.status().message(), HasSubstr("runs past the data"));
}

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 9) + 1);
  return out;
}

// `count` whole float32 entries "t<i>" of elements(i) elements each, round-robin over `ranks` files
// of a checkpoint of `step` committed under root. Returns each entry's bytes, by i.
std::vector<std::vector<uint8_t>> WriteSmallWholeEntries(const std::string& root, int64_t step, int ranks, int count,
                                                         const std::function<int64_t(int)>& elements) {
  auto out = OfflineCheckpointWriter::Begin(root, step, ranks).value();
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < count; ++i) {
    data.push_back(Pattern(4 * static_cast<size_t>(elements(i)), static_cast<uint32_t>(i)));
    EXPECT_TRUE(out->AddPiece(i % ranks, "t" + std::to_string(i), DType::kFloat32, {elements(i)}, Layout::Whole(),
                              data.back().data(), data.back().size()).ok()) << i;
  }
  EXPECT_TRUE(out->Commit(CreationInfo{}).ok());
  return data;
}

// `count` float32 entries "t0", "t1", ... of `elements(i)` (a multiple of `ranks`) each, cut into
// one flat range per rank, as a checkpoint resharded to many ranks holds them; their bytes.
std::vector<std::vector<uint8_t>> WriteEntriesAcrossRanks(const std::string& root, int64_t step, int ranks, int count,
                                                          const std::function<int64_t(int)>& elements) {
  auto out = OfflineCheckpointWriter::Begin(root, step, ranks).value();
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < count; ++i) {
    const int64_t n = elements(i), per = n / ranks;
    data.push_back(Pattern(4 * static_cast<size_t>(n), static_cast<uint32_t>(i)));
    for (int r = 0; r < ranks; ++r) {
      EXPECT_TRUE(out->AddPiece(r, "t" + std::to_string(i), DType::kFloat32, {n}, Layout::FlatRange(r * per, (r + 1) * per),
                                data.back().data() + r * per * 4, static_cast<size_t>(per) * 4).ok()) << i;
    }
  }
  EXPECT_TRUE(out->Commit(CreationInfo{}).ok());
  return data;
}

// Thousands of small chunks and two large ones through the writer and the reader: the data area is
// the chunks' bytes plus at most a few bytes each, large chunks stay on blocks, every chunk reads
// back exactly, and a flipped byte in a shared block is reported naming the chunks in it.
TEST(ChunkOffset, PackedFileReadsBackThroughAlignedVerifiedReads) {
  testing::TempDir dir;
  std::unique_ptr<IoEngine> io = CreateIoEngine();
  auto pool = BufferPool::Create(3, 64 << 10).value();
  std::vector<size_t> sizes, elements;
  for (size_t i = 0; i < 3000; ++i) {
    elements.push_back(i % 3 == 0 ? 2 : 4);
    sizes.push_back(elements.back() * (1 + (i * 37) % 300));
    if (i == 1000 || i == 2000) {
      sizes.push_back(kPackBelowBytes + 4 * (i / 1000) + 4);  // large, and not a whole number of blocks
      elements.push_back(4);
    }
  }
  std::vector<std::vector<uint8_t>> data;
  AlignedBuffer large_memory = AlignedBuffer::Allocate(2 * kPackBelowBytes + 4 * kBlockSize).value();
  ShardFileWriter writer(io.get(), pool.get(), /*always_stage=*/false);
  ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  size_t large_used = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.push_back(Pattern(sizes[i], static_cast<uint32_t>(i)));
    const void* from = data.back().data();
    if (sizes[i] >= kPackBelowBytes) {  // aligned memory: the zero-copy path
      unsigned char* at = large_memory.data() + large_used;
      std::memcpy(at, data.back().data(), sizes[i]);
      large_used += AlignUp(sizes[i], kBlockSize);
      from = at;
    }
    offsets.push_back(writer.Append(from, sizes[i], elements[i]).value());
    total += sizes[i];
    EXPECT_EQ(offsets.back() % elements[i], 0u) << "chunk " << i;
    if (sizes[i] >= kPackBelowBytes) {
      EXPECT_EQ(offsets.back() % kBlockSize, 0u) << "large chunk " << i;
    }
  }
  Result<FileRecord> record = writer.Finish();
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  // Padding: at most an element per small chunk, a block per large one, and the last block.
  EXPECT_LE(record->table_offset, total + 2 * sizes.size() + 3 * kBlockSize);

  Manifest m;
  m.files.push_back(*record);
  std::vector<CopyRequest> copies;
  std::vector<std::vector<uint8_t>> got(sizes.size());
  ReadTargets targets;
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i) names.push_back("t" + std::to_string(i));
  for (size_t i = 0; i < sizes.size(); ++i) {
    got[i].assign(sizes[i], 0xEE);
    copies.push_back(CopyRequest{0, offsets[i], sizes[i], static_cast<uint32_t>(i), 0});
    targets.base.push_back(got[i].data());
    targets.names.push_back(names[i]);
  }
  ReadPlanOptions options;
  options.max_extent = pool->buffer_bytes();
  ReadPlan plan = CoalesceReads(copies, options);
  for (const ReadExtent& e : plan.extents) {
    EXPECT_EQ(e.offset % kBlockSize, 0u);
    EXPECT_EQ(e.length % kBlockSize, 0u);
  }
  EXPECT_EQ(plan.bytes_read, record->table_offset);  // every block once, none twice
  ReadStats stats;
  Status read = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, /*verify=*/true, &stats);
  ASSERT_TRUE(read.ok()) << read.ToString();
  for (size_t i = 0; i < sizes.size(); ++i) ASSERT_EQ(got[i], data[i]) << "chunk " << i;

  // Chunks 1 and 2 share the file's first block; a flipped byte in chunk 2 names both.
  ASSERT_LT(offsets[2], kBlockSize);
  const std::string path = JoinPath(dir.path(), "rank-00000.bin");
  std::string file = ReadFileLimited(path, 64 << 20).value();
  AlignedBuffer good = AlignedBuffer::Allocate(file.size()).value();
  std::memcpy(good.data(), file.data(), file.size());
  file[offsets[2]] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  Status corrupt = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &stats);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.message(), HasSubstr("checksum mismatch in the block at offset 0 holding"));
  EXPECT_THAT(corrupt.message(), HasSubstr("'t1'"));
  EXPECT_THAT(corrupt.message(), HasSubstr("'t2'"));

  // A file already in memory (a load's read ahead) is read from there, table pages included:
  // the good copy loads although the file is damaged, and the damaged copy fails alike although
  // the file is whole again.
  for (auto& g : got) std::fill(g.begin(), g.end(), 0xEE);
  ReadStats from_memory;
  Status read_good = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &from_memory,
                                     FileInMemory{0, good.data(), file.size()});
  ASSERT_TRUE(read_good.ok()) << read_good.ToString();
  for (size_t i = 0; i < sizes.size(); ++i) ASSERT_EQ(got[i], data[i]) << "chunk " << i;
  EXPECT_EQ(from_memory.data_bytes_read, 0u);
  EXPECT_EQ(from_memory.table_bytes_read, 0u);
  EXPECT_EQ(from_memory.extents, plan.extents.size());
  AlignedBuffer damaged = AlignedBuffer::Allocate(file.size()).value();
  std::memcpy(damaged.data(), file.data(), file.size());
  file[offsets[2]] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  Status read_damaged = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &from_memory,
                                        FileInMemory{0, damaged.data(), file.size()});
  ASSERT_FALSE(read_damaged.ok());
  EXPECT_THAT(read_damaged.message(), HasSubstr("checksum mismatch in the block at offset 0 holding"));
  EXPECT_THAT(read_damaged.message(), HasSubstr("'t2'"));
  // Bytes it does not cover (here: all of them) are read from the file.
  ReadStats short_copy;
  ASSERT_TRUE(ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &short_copy,
                              FileInMemory{0, damaged.data(), kBlockSize / 2})
                  .ok());
  EXPECT_EQ(short_copy.data_bytes_read, plan.bytes_read);

  // A read that fails while reads issued before it are in flight (here a missing file of another
  // format, read buffered) reports the earlier reads' failure, which happened first: the damaged
  // block (in the last extent, still in flight), not only the missing file.
  file[offsets.back()] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  Manifest with_missing = m;
  FileRecord missing;
  missing.name = "missing.distcp";
  missing.size = 100;
  missing.checksums = false;
  with_missing.files.push_back(missing);
  std::vector<CopyRequest> then_missing = copies;
  std::vector<uint8_t> tail_target(10);
  then_missing.push_back(CopyRequest{1, 0, tail_target.size(), static_cast<uint32_t>(sizes.size()), 0});
  ReadTargets with_tail = targets;
  with_tail.base.push_back(tail_target.data());
  with_tail.names.push_back("tail");
  ReadPlan missing_plan = CoalesceReads(then_missing, options);
  ASSERT_EQ(missing_plan.extents.back().file, 1u);
  Status earlier = ExecuteReadPlan(io.get(), pool.get(), dir.path(), with_missing, missing_plan, with_tail, true, &stats);
  ASSERT_FALSE(earlier.ok());
  EXPECT_EQ(earlier.code(), Code::kDataLoss) << earlier.ToString();
  EXPECT_THAT(earlier.message(), HasSubstr("'t" + std::to_string(sizes.size() - 1) + "'"));
}

// An extent larger than the scatter window (256 KiB) is verified and scattered window by window:
// copies across windows, ending on a window's last byte, overlapping each other, at the end,
// and in an order other than the extent's (which goes the two-pass way) all land exactly, and a
// damaged block in a later window still names its tensor.
TEST(ChunkOffset, AnExtentIsVerifiedAndScatteredWindowByWindow) {
  testing::TempDir dir;
  std::unique_ptr<IoEngine> io = CreateIoEngine();
  auto pool = BufferPool::Create(2, 2 << 20).value();
  const size_t bytes = (1 << 20) + 8192 + 100;
  const std::vector<uint8_t> data = Pattern(bytes, 7);
  ShardFileWriter writer(io.get(), pool.get(), /*always_stage=*/true);
  ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
  ASSERT_EQ(writer.Append(data.data(), bytes, 1).value(), 0u);
  Manifest m;
  m.files.push_back(writer.Finish().value());
  const uint64_t window = 256 << 10;
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 10}, {100, 700 << 10}, {window - 4, 10}, {window - 1, 1}, {300000, 5000}, {bytes - 7, 7}};
  std::vector<std::vector<uint8_t>> got(ranges.size());
  std::vector<std::string> names;
  for (size_t i = 0; i < ranges.size(); ++i) names.push_back("t" + std::to_string(i));
  ReadTargets targets;
  ReadPlan plan;
  plan.extents.push_back(ReadExtent{0, 0, AlignUp(bytes, kBlockSize), 0, ranges.size()});
  for (size_t i = 0; i < ranges.size(); ++i) {
    got[i].assign(ranges[i].second, 0xEE);
    targets.base.push_back(got[i].data());
    targets.names.push_back(names[i]);
    plan.copies.push_back(ScatterCopy{ranges[i].first, ranges[i].second, static_cast<uint32_t>(i), 0});
  }
  auto expect_exact = [&](const std::string& what) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto from = data.begin() + static_cast<std::ptrdiff_t>(ranges[i].first);
      EXPECT_TRUE(std::equal(got[i].begin(), got[i].end(), from)) << what << ": " << names[i];
      std::fill(got[i].begin(), got[i].end(), 0xEE);
    }
  };
  ReadStats stats;
  Status read = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &stats);
  ASSERT_TRUE(read.ok()) << read.ToString();
  expect_exact("in extent order");
  std::swap(plan.copies[1], plan.copies[4]);
  read = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &stats);
  ASSERT_TRUE(read.ok()) << read.ToString();
  expect_exact("out of order");
  std::swap(plan.copies[1], plan.copies[4]);

  const std::string path = JoinPath(dir.path(), "rank-00000.bin");
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[600 << 10] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  Status corrupt = ExecuteReadPlan(io.get(), pool.get(), dir.path(), m, plan, targets, true, &stats);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.message(), HasSubstr("checksum mismatch in the block at offset " + std::to_string(600 << 10) +
                                           " holding 't1'"));
}

std::vector<size_t> AllEntries(const Manifest& m) {
  std::vector<size_t> all(m.entries.size());
  for (size_t e = 0; e < all.size(); ++e) all[e] = e;
  return all;
}

// Reads `entries` (named t<i>, holding data[i]) whole, in the order given: each read either
// matches its data or fails as damaged naming its entry, which is added to `failed`.
void WalkEntries(CheckpointReader& reader, const std::vector<size_t>& entries,
                 const std::vector<std::vector<uint8_t>>& data, std::vector<std::string>* failed) {
  const Manifest& m = reader.manifest();
  std::vector<uint8_t> got;
  for (size_t e : entries) {
    const size_t i = std::stoul(m.entries[e].name.substr(1));
    got.assign(data[i].size(), 0xEE);
    Status read = reader.ReadPiece(e, Layout::Whole(), got.data());
    if (!read.ok()) {
      EXPECT_EQ(read.code(), Code::kDataLoss) << read.ToString();
      EXPECT_THAT(read.message(), HasSubstr("'" + m.entries[e].name + "'"));
      failed->push_back(m.entries[e].name);
      continue;
    }
    EXPECT_EQ(got, data[i]) << m.entries[e].name;
  }
}

// The tools read small entries through CheckpointReader's read-ahead windows: many pieces per
// read, each block verified once; a damaged block fails only the pieces it holds, named.
TEST(ChunkOffset, ReadAheadServesPackedPiecesAndNamesTheDamagedOne) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(root, 3, 2, 400, [](int i) { return 1 + i % 50; });
  ASSERT_FALSE(HasFailure());
  const std::string folder = JoinPath(root, StepDirName(3));
  auto reader = CheckpointReader::Open(root).value();
  const Manifest m = reader->manifest();  // a copy: the reader is replaced below
  EXPECT_EQ(m.format_minor, 1);
  auto read = [&](size_t i, std::vector<uint8_t>* got) {
    got->assign(data[i].size(), 0xEE);
    size_t entry = 0;
    while (m.entries[entry].name != "t" + std::to_string(i)) ++entry;
    return reader->ReadPiece(entry, Layout::Whole(), got->data());
  };
  std::vector<uint8_t> got;
  for (size_t i = 0; i < data.size(); ++i) {
    ASSERT_TRUE(read(i, &got).ok()) << i;
    ASSERT_EQ(got, data[i]) << i;
  }
  EXPECT_EQ(reader->stats().data_bytes_read, m.files[0].table_offset + m.files[1].table_offset);  // each block once

  // Damage t200 (file 0): a fresh reader still reads its neighbours, and t200's error names it.
  uint64_t at = 0;
  for (const EntryRecord& e : m.entries) {
    if (e.name == "t200") at = e.chunks[0].offset;
  }
  const std::string path = JoinPath(folder, "rank-00000.bin");
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[at] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  reader = CheckpointReader::Open(root).value();
  ASSERT_GE(at, kBlockSize);  // t0 starts file 0, in another block
  Status neighbour = read(0, &got);
  ASSERT_TRUE(neighbour.ok()) << neighbour.ToString();
  EXPECT_EQ(got, data[0]);
  Status damaged = read(200, &got);
  EXPECT_EQ(damaged.code(), Code::kDataLoss);
  EXPECT_THAT(damaged.message(), HasSubstr("'t200'"));
  EXPECT_THAT(damaged.message(), HasSubstr("checksum mismatch"));
}

// A file walked in order, window after window: from the second window on, the next one is read in
// the background while this one is served; entries straddling two windows come back whole, each
// block is read once, a read-ahead window with a damaged block still serves its other entries,
// and the damaged one is named.
TEST(ChunkOffset, ReadAheadWalksAFileWindowAfterWindow) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  // One file of about 3.3 windows of packed entries of about 28 KiB (straddling every boundary).
  const uint64_t window = CheckpointReader::kMaxWindow;
  const int count = static_cast<int>(window * 33 / 10 / 28000);
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(root, 1, 1, count, [](int i) { return 7000 + i % 13; });
  ASSERT_FALSE(HasFailure());
  auto walk = [&](CheckpointReader& reader, std::vector<std::string>* failed) {
    WalkEntries(reader, AllEntries(reader.manifest()), data, failed);
  };
  auto reader = CheckpointReader::Open(root).value();
  const Manifest m = reader->manifest();
  ASSERT_EQ(m.files.size(), 1u);
  ASSERT_GT(m.files[0].table_offset, 3 * window);
  std::vector<std::string> failed;
  walk(*reader, &failed);
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(reader->stats().data_bytes_read, m.files[0].table_offset);  // each block once
  // The first two windows read when needed (the walk is seen going on at the second), the rest
  // in the background.
  EXPECT_EQ(reader->stats().bytes_read_ahead, m.files[0].table_offset - 2 * window);
  // Back to the start (a jump): served again, exactly.
  std::vector<uint8_t> got(data[0].size());
  ASSERT_TRUE(reader->ReadPiece(0, Layout::Whole(), got.data()).ok());
  EXPECT_EQ(got, data[0]);

  // Damage an entry in the third window, which is read ahead.
  const EntryRecord* damaged = nullptr;
  for (const EntryRecord& e : m.entries) {
    if (damaged == nullptr && e.chunks[0].offset > 2 * window + kBlockSize) damaged = &e;
  }
  ASSERT_NE(damaged, nullptr);
  const std::string path = JoinPath(JoinPath(root, StepDirName(1)), "rank-00000.bin");
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[damaged->chunks[0].offset + 12000] ^= 1;  // a block of this entry alone
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  reader = CheckpointReader::Open(root).value();
  failed.clear();
  walk(*reader, &failed);
  EXPECT_EQ(failed, std::vector<std::string>{damaged->name});
  // Near the damage each piece is read alone, not a window again for each: each block about once.
  EXPECT_LT(reader->stats().data_bytes_read, 2 * m.files[0].table_offset);
  EXPECT_GT(reader->stats().bytes_read_ahead, 0u);  // the damaged window was one read ahead
}

// A reader told which entries it will read (a consolidation with --include) reads their blocks
// and little else: windows end where the wanted bytes do and are not read ahead into the rest.
// Entries of about 200 KiB, one in three wanted, as a model's among its optimizer moments.
TEST(ChunkOffset, AReaderToldItsEntriesReadsOnlyTheirBytes) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(root, 1, 1, 60, [](int i) { return 50000 + i; });
  ASSERT_FALSE(HasFailure());
  auto read_every_third = [&](bool told, uint64_t* wanted_bytes) {
    auto reader = CheckpointReader::Open(root).value();
    const Manifest& m = reader->manifest();
    std::vector<size_t> entries;
    *wanted_bytes = 0;
    for (size_t e = 0; e < m.entries.size(); ++e) {
      if (std::stoul(m.entries[e].name.substr(1)) % 3 != 0) continue;
      entries.push_back(e);
      const ChunkRecord& c = m.entries[e].chunks.at(0);
      *wanted_bytes += AlignUp(c.offset + c.bytes, kBlockSize) - AlignDown(c.offset, kBlockSize);
    }
    if (told) reader->ReadOnly(entries);
    std::vector<uint8_t> got;
    for (size_t e : entries) {
      const size_t i = std::stoul(m.entries[e].name.substr(1));
      got.assign(data[i].size(), 0xEE);
      EXPECT_TRUE(reader->ReadPiece(e, Layout::Whole(), got.data()).ok()) << i;
      EXPECT_EQ(got, data[i]) << i;
    }
    return reader->stats().data_bytes_read;
  };
  uint64_t wanted = 0;
  const uint64_t told = read_every_third(true, &wanted);
  EXPECT_EQ(told, wanted);  // each wanted block once, no other
  const uint64_t untold = read_every_third(false, &wanted);
  EXPECT_GT(untold, 2 * wanted);  // windows and read-ahead over the whole file

  // An entry the reader was not told of, starting in a wanted span's last block and running
  // past it: read whole and right, not copied from a window cut at the span's end.
  auto reader = CheckpointReader::Open(root).value();
  const Manifest& m = reader->manifest();
  auto index_of = [&](const std::string& name) {
    size_t e = 0;
    while (m.entries[e].name != name) ++e;
    return e;
  };
  reader->ReadOnly({index_of("t0")});
  std::vector<uint8_t> got(data[1].size(), 0xEE);
  ASSERT_TRUE(reader->ReadPiece(index_of("t1"), Layout::Whole(), got.data()).ok());
  EXPECT_EQ(got, data[1]);
  got.assign(data[0].size(), 0xEE);
  ASSERT_TRUE(reader->ReadPiece(index_of("t0"), Layout::Whole(), got.data()).ok());
  EXPECT_EQ(got, data[0]);
  reader->ReadOnly({index_of("t2")});  // told again: the windows read before go
  got.assign(data[1].size(), 0xEE);
  ASSERT_TRUE(reader->ReadPiece(index_of("t1"), Layout::Whole(), got.data()).ok());
  EXPECT_EQ(got, data[1]);
}

// A checkpoint of 300 rank files loaded by one process under an open-file limit of 100: the
// load keeps a bounded number of files open (it opened all at once and failed with EMFILE at
// about a thousand files under the default `ulimit -n`).
TEST(ChunkOffset, ALoadOfManyFilesStaysUnderTheOpenFileLimit) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const int world = 300;
  const std::vector<std::vector<uint8_t>> data = WriteEntriesAcrossRanks(root, 1, world, 3, [](int) { return 1024 * world; });
  ASSERT_FALSE(HasFailure());
  std::vector<std::vector<uint8_t>> got(data.size());
  ShardedState targets;
  for (size_t i = 0; i < data.size(); ++i) {
    got[i].assign(data[i].size(), 0xEE);
    ASSERT_TRUE(targets.AddTensor("t" + std::to_string(i), DType::kFloat32, {1024 * world}, Layout::Whole(), got[i].data()).ok());
  }
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  struct rlimit lowered = before;
  lowered.rlim_cur = 100;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  Result<LoadReport> loaded = Load(*comm, root, targets);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &before), 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(got, data);
}

// An entry cut across every file of a wide checkpoint (a consolidation after a reshard to many
// ranks): one window per file, so reading entry after entry still reads each block once.
TEST(ChunkOffset, ReadAheadReadsEachBlockOnceAcrossManyFiles) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const int world = 70;
  const std::vector<std::vector<uint8_t>> data =
      WriteEntriesAcrossRanks(root, 1, world, 60, [](int i) { return world * (1 + i % 3); });
  ASSERT_FALSE(HasFailure());
  auto reader = CheckpointReader::Open(root).value();
  const Manifest& m = reader->manifest();
  uint64_t data_bytes = 0;
  for (const FileRecord& f : m.files) data_bytes += f.table_offset;
  std::vector<uint8_t> got;
  for (size_t e = 0; e < m.entries.size(); ++e) {
    const size_t i = std::stoul(m.entries[e].name.substr(1));
    got.assign(data[i].size(), 0xEE);
    ASSERT_TRUE(reader->ReadPiece(e, Layout::Whole(), got.data()).ok());
    ASSERT_EQ(got, data[i]) << m.entries[e].name;
  }
  EXPECT_EQ(reader->stats().data_bytes_read, data_bytes);
}

// ReadFirstWindowsAhead reads every file's first window in one background plan: a walk then reads
// each block once (the first windows ahead, the second when the walk reaches it, the rest ahead
// again); after ReadOnly it reads only wanted bytes; a damaged block in a first window fails that
// read alone, and the pieces are read as before, the damaged one named.
TEST(ChunkOffset, FirstWindowsReadAheadServeTheWalkAndNameADamagedBlock) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const uint64_t window = CheckpointReader::kMaxWindow;
  // Three files of about 2.5 windows each, entries of about 28 KiB in turn across them.
  const int count = static_cast<int>(window * 75 / 10 / 28000);
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(root, 1, 3, count, [](int i) { return 7000 + i % 13; });
  ASSERT_FALSE(HasFailure());
  auto walk = [&](CheckpointReader& reader, const std::vector<size_t>& entries, std::vector<std::string>* failed) {
    WalkEntries(reader, entries, data, failed);
  };
  auto reader = CheckpointReader::Open(root).value();
  const Manifest m = reader->manifest();
  ASSERT_EQ(m.files.size(), 3u);
  const std::vector<size_t> all = AllEntries(m);
  uint64_t data_bytes = 0;
  for (const FileRecord& f : m.files) {
    ASSERT_GT(f.table_offset, 2 * window);
    data_bytes += f.table_offset;
  }
  reader->ReadFirstWindowsAhead();
  EXPECT_EQ(reader->first_windows_kept(), 3u);
  std::vector<std::string> failed;
  walk(*reader, all, &failed);
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(reader->stats().data_bytes_read, data_bytes);  // each block once
  EXPECT_EQ(reader->stats().bytes_read_ahead, data_bytes - 3 * window);  // all but each file's second window

  // Told its entries first (runs of 8 in files 0 and 1, gaps of 8 far wider than kWindowGap,
  // none of file 2): the first windows hold wanted blocks only.
  reader = CheckpointReader::Open(root).value();
  std::vector<size_t> some;
  std::vector<std::pair<uint64_t, uint64_t>> blocks;  // (file, block) of each wanted block
  for (size_t e : all) {
    const size_t i = std::stoul(m.entries[e].name.substr(1));
    if (i % 3 == 2 || (i / 24) % 2 == 1) continue;
    some.push_back(e);
    const ChunkRecord& c = m.entries[e].chunks.at(0);
    for (uint64_t b = c.offset / kBlockSize; b * kBlockSize < c.offset + c.bytes; ++b) blocks.emplace_back(c.file, b);
  }
  std::sort(blocks.begin(), blocks.end());
  const uint64_t wanted = kBlockSize * static_cast<uint64_t>(std::unique(blocks.begin(), blocks.end()) - blocks.begin());
  reader->ReadOnly(some);
  reader->ReadFirstWindowsAhead();
  walk(*reader, some, &failed);
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(reader->stats().data_bytes_read, wanted);
  EXPECT_GT(reader->stats().bytes_read_ahead, 0u);

  // A damaged block in file 1's first window: every other entry is still served, that one named.
  const EntryRecord* damaged = nullptr;
  for (const EntryRecord& e : m.entries) {
    if (damaged == nullptr && e.chunks[0].file == 1 && e.chunks[0].offset > window / 2) damaged = &e;
  }
  ASSERT_NE(damaged, nullptr);
  const std::string path = JoinPath(JoinPath(root, StepDirName(1)), m.files[1].name);
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[damaged->chunks[0].offset + 12000] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  reader = CheckpointReader::Open(root).value();
  reader->ReadFirstWindowsAhead();
  EXPECT_EQ(reader->first_windows_kept(), 2u);  // files 0 and 2: the damaged block fails file 1's alone
  walk(*reader, all, &failed);
  EXPECT_EQ(failed, std::vector<std::string>{damaged->name});
  // Near the damage each piece is read alone, not a window again for each: each block about once.
  EXPECT_LT(reader->stats().data_bytes_read, 2 * data_bytes);

  // Entries wider than a window are read on their own: no first window is read for nothing.
  const std::string wide_root = JoinPath(dir.path(), "wide");
  const std::vector<std::vector<uint8_t>> wide =
      WriteSmallWholeEntries(wide_root, 1, 2, 4, [&](int i) { return static_cast<int64_t>(window / 4 + 1000 * (i + 1)); });
  ASSERT_FALSE(HasFailure());
  reader = CheckpointReader::Open(wide_root).value();
  reader->ReadFirstWindowsAhead();
  EXPECT_EQ(reader->first_windows_kept(), 0u);
  WalkEntries(*reader, AllEntries(reader->manifest()), wide, &failed);
  uint64_t wide_bytes = 0;
  for (const FileRecord& f : reader->manifest().files) wide_bytes += f.table_offset;
  EXPECT_EQ(reader->stats().data_bytes_read, wide_bytes);  // each block once, none more
  EXPECT_EQ(failed, std::vector<std::string>{damaged->name});
}

// Consolidation reads many packed entries a batch at a time from aligned read-ahead windows:
// every byte lands in the export, and a damaged block still fails it naming the file and entry.
TEST(ChunkOffset, ConsolidateBatchesPackedEntriesAndNamesADamagedBlock) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const std::vector<std::vector<uint8_t>> data =
      WriteSmallWholeEntries(root, 1, 3, 500, [](int i) { return 1 + (i * 7) % 90; });
  ASSERT_FALSE(HasFailure());
  const std::string folder = JoinPath(root, StepDirName(1));
  for (uint64_t window : {uint64_t{4096}, uint64_t{32} << 20}) {  // batches of a few entries, and of all
    ConsolidateOptions options;
    options.format = ExportFormat::kSafetensors;
    options.window_bytes = window;
    const std::string file = JoinPath(dir.path(), "all-" + std::to_string(window) + ".safetensors");
    Result<ConsolidateReport> report = Consolidate(root, file, options);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    const std::string bytes = ReadFileLimited(file, 1 << 24).value();
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    auto entries = ParseSafetensorsHeader(bytes.substr(8, n), bytes.size() - 8 - n, file).value();
    ASSERT_EQ(entries.size(), data.size());
    for (const SafetensorsEntry& e : entries) {
      const std::vector<uint8_t>& want = data[std::stoul(e.name.substr(1))];
      ASSERT_EQ(bytes.substr(8 + n + e.begin, e.end - e.begin), std::string(want.begin(), want.end())) << e.name;
    }
  }
  const Manifest m = ReadManifest(folder).value();
  uint64_t at = 0;
  for (const EntryRecord& e : m.entries) {
    if (e.name == "t301") at = e.chunks[0].offset + 2;  // file rank-00001.bin (301 % 3)
  }
  const std::string path = JoinPath(folder, "rank-00001.bin");
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[at] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  Result<ConsolidateReport> damaged = Consolidate(root, JoinPath(dir.path(), "bad.safetensors"), options);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), Code::kDataLoss);
  // The first entry read from the damaged block fails the export, naming the block and every
  // entry in it: the block's checksum cannot tell which of them holds the flipped bit, and one
  // --exclude leaves them all out.
  EXPECT_THAT(damaged.status().message(), HasSubstr("rank-00001.bin: checksum mismatch in the block at offset " +
                                                    std::to_string(AlignDown(at, kBlockSize)) + " holding"));
  const uint64_t block = AlignDown(at, kBlockSize);
  size_t in_block = 0;
  for (const EntryRecord& e : m.entries) {
    const ChunkRecord& c = e.chunks.at(0);
    if (c.file != 1 || c.offset >= block + kBlockSize || c.offset + c.bytes <= block) continue;
    in_block++;
    EXPECT_THAT(damaged.status().message(), HasSubstr("'" + e.name + "'"));
  }
  EXPECT_GE(in_block, 3u);
}

// Small entries between entries wider than a window (a model's norms between its weights): the
// windows serving the small ones stop where a wide one starts, and are not read ahead into it,
// so each block is read once but the one a wide entry shares with the next (a window ran 4 MiB
// into each wide entry, which was then read again on its own: 1.4x the bytes).
TEST(ChunkOffset, WindowsStopWhereAnEntryWiderThanAWindowStarts) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const uint64_t window = CheckpointReader::kMaxWindow;
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(
      root, 1, 1, 12, [&](int i) { return i % 2 == 0 ? int64_t{3} + i : static_cast<int64_t>(window / 4 + 5000 * i); });
  ASSERT_FALSE(HasFailure());
  for (bool first_windows : {false, true}) {
    auto reader = CheckpointReader::Open(root).value();
    if (first_windows) reader->ReadFirstWindowsAhead();
    std::vector<std::string> failed;
    WalkEntries(*reader, AllEntries(reader->manifest()), data, &failed);
    EXPECT_TRUE(failed.empty());
    // At most the block a wide entry ends in, shared with the small one after it, twice.
    const uint64_t bytes = reader->manifest().files[0].table_offset;
    EXPECT_GE(reader->stats().data_bytes_read, bytes);
    EXPECT_LE(reader->stats().data_bytes_read, bytes + 6 * kBlockSize) << first_windows;
  }
}

// A walk through one chunk wider than a window in small slices (a piece of a column-sharded
// tensor is a row at a time) is served from windows inside the chunk, read ahead as any walk.
TEST(ChunkOffset, SlicesOfAWideChunkAreReadAhead) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const uint64_t window = CheckpointReader::kMaxWindow;
  const int64_t elements = static_cast<int64_t>(3 * window / 4 + 777);
  const std::vector<std::vector<uint8_t>> data = WriteSmallWholeEntries(root, 1, 1, 1, [&](int) { return elements; });
  ASSERT_FALSE(HasFailure());
  auto reader = CheckpointReader::Open(root).value();
  std::vector<uint8_t> got(static_cast<size_t>(elements) * 4);
  for (int64_t a = 0; a < elements; a += 1000) {
    const int64_t b = std::min(elements, a + 1000);
    ASSERT_TRUE(reader->ReadPiece(0, Layout::FlatRange(a, b), got.data() + a * 4).ok()) << a;
  }
  EXPECT_EQ(got, data[0]);
  EXPECT_EQ(reader->stats().data_bytes_read, reader->manifest().files[0].table_offset);  // each block once
  EXPECT_GE(reader->stats().bytes_read_ahead, window);  // the third window, in the background
}

// A damaged block of 4-byte values holds 1024 of them: the message names a hundred (the ones
// being read first) and counts the rest.
TEST(ChunkOffset, ADamagedBlockOfManyValuesIsNamedInBrief) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  WriteSmallWholeEntries(root, 1, 1, 3000, [](int) { return int64_t{1}; });
  ASSERT_FALSE(HasFailure());
  const Manifest m = ReadManifest(JoinPath(root, StepDirName(1))).value();
  const std::string path = JoinPath(JoinPath(root, StepDirName(1)), m.files[0].name);
  std::string file = ReadFileLimited(path, 64 << 20).value();
  file[kBlockSize + 100] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, file, "test").ok());
  Result<ConsolidateReport> damaged = Consolidate(root, JoinPath(dir.path(), "out.pt"), ConsolidateOptions{});
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), Code::kDataLoss);
  size_t in_block = 0;
  for (const EntryRecord& e : m.entries) {
    const ChunkRecord& c = e.chunks.at(0);
    if (c.offset < 2 * kBlockSize && c.offset + c.bytes > kBlockSize) in_block++;
  }
  ASSERT_GT(in_block, 500u);
  EXPECT_THAT(damaged.status().message(), HasSubstr(", and " + std::to_string(in_block - 100) + " more"));
  EXPECT_LT(damaged.status().message().size(), 4000u);
}

// A data file missing (or cut short) fails only what needs it: a consolidation of the entries
// other files hold succeeds, and one that needs it fails before writing, naming the file and
// the entries it holds.
TEST(ChunkOffset, AMissingFileFailsOnlyTheConsolidationsThatNeedIt) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  WriteSmallWholeEntries(root, 1, 3, 30, [](int i) { return 10 + i; });  // t<i> in rank i % 3's file
  ASSERT_FALSE(HasFailure());
  const std::string folder = JoinPath(root, StepDirName(1));
  ASSERT_EQ(::unlink(JoinPath(folder, "rank-00002.bin").c_str()), 0);
  ConsolidateOptions some;
  some.include = {"t0", "t1", "t3", "t4"};
  const std::string some_out = JoinPath(dir.path(), "some.pt");
  Result<ConsolidateReport> fine = Consolidate(root, some_out, some);
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->entries, 4u);
  const std::string all_out = JoinPath(dir.path(), "all.pt");
  Result<ConsolidateReport> missing = Consolidate(root, all_out, ConsolidateOptions{});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("the file holding 't2', 't5', 't8'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("data file 'rank-00002.bin' is missing"));
  EXPECT_FALSE(PathExists(all_out));
  EXPECT_FALSE(PathExists(all_out + ".partial"));
  // Cut short: the same, as data loss.
  const std::string path = JoinPath(folder, "rank-00001.bin");
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  some.include = {"t1"};
  Result<ConsolidateReport> short_file = Consolidate(root, JoinPath(dir.path(), "t1.pt"), some);
  ASSERT_FALSE(short_file.ok());
  EXPECT_EQ(short_file.status().code(), Code::kDataLoss);
  EXPECT_THAT(short_file.status().message(), HasSubstr("the file holding 't1': "));
  EXPECT_THAT(short_file.status().message(), HasSubstr("data file 'rank-00001.bin' is 4096 bytes"));
  some.include = {"t0", "t3"};
  EXPECT_TRUE(Consolidate(root, some_out, some).ok());
}

// A --strip-prefix that starts no selected name, or a glob that matches nothing (a typo), is said,
// not silently ignored.
TEST(ChunkOffset, AStripPrefixThatMatchesNothingIsSaid) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  WriteSmallWholeEntries(root, 1, 1, 3, [](int i) { return 1 + i; });
  ASSERT_FALSE(HasFailure());
  ConsolidateOptions options;
  options.strip_prefix = "model.";
  ::testing::internal::CaptureStderr();
  Result<ConsolidateReport> done = Consolidate(root, JoinPath(dir.path(), "out.pt"), options);
  std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_THAT(said, HasSubstr("--strip-prefix 'model.' starts no selected name (the first is 't0')"));
  options.strip_prefix = "t";  // starts them all: nothing said
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(Consolidate(root, JoinPath(dir.path(), "out2.pt"), options).ok());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), Not(HasSubstr("--strip-prefix")));
  // So is an --include or --exclude glob that matches nothing.
  options.strip_prefix.clear();
  options.include = {"t1", "model.*"};
  options.exclude = {"t9"};
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(Consolidate(root, JoinPath(dir.path(), "out3.pt"), options).ok());
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, HasSubstr("--include 'model.*' matches no entry or value"));
  EXPECT_THAT(said, HasSubstr("--exclude 't9' matches no entry or value"));
  EXPECT_THAT(said, Not(HasSubstr("'t1'")));
}

}  // namespace
}  // namespace shardckpt
