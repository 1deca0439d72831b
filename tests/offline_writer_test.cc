#include "shardckpt/engine/core/offline_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

// Float32 values i + 1000 * tensor: each element says where it belongs.
std::vector<float> Values(int64_t count, int tensor) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = static_cast<float>(i + 1000 * tensor);
  return out;
}

// The writer keeps most chunks as a form and one number (whole, flat range, run of rows) and
// any other layout as given: every kind comes back in the manifest as added, files numbered and
// each entry's chunks in file order, and a load reads the values back.
TEST(OfflineWriter, EveryLayoutKindIsCommittedAsAddedAndLoadsBack) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const std::vector<float> scalar = Values(1, 0), flat = Values(10, 1), rows = Values(4 * 3, 2), cols = Values(2 * 6, 3),
                           dim0_3d = Values(3 * 2 * 2, 4);
  {
    auto out = OfflineCheckpointWriter::Begin(root, 1, 3).value();
    ASSERT_TRUE(out->AddPiece(0, "scalar", DType::kFloat32, {}, Layout::Whole(), scalar.data(), 4).ok());
    // Flat ranges, added rank 2 first: the manifest lists them in file order.
    ASSERT_TRUE(out->AddPiece(2, "flat", DType::kFloat32, {10}, Layout::FlatRange(6, 10), flat.data() + 6, 16).ok());
    ASSERT_TRUE(out->AddPiece(0, "flat", DType::kFloat32, {10}, Layout::FlatRange(0, 6), flat.data(), 24).ok());
    // Runs of rows, and a full box that is the whole tensor.
    ASSERT_TRUE(out->AddPiece(0, "rows", DType::kFloat32, {4, 3}, Layout::Box({0, 0}, {3, 3}), rows.data(), 36).ok());
    ASSERT_TRUE(out->AddPiece(1, "rows", DType::kFloat32, {4, 3}, Layout::Box({3, 0}, {1, 3}), rows.data() + 9, 12).ok());
    ASSERT_TRUE(out->AddPiece(1, "dim0_3d", DType::kFloat32, {3, 2, 2}, Layout::Box({0, 0, 0}, {3, 2, 2}),
                              dim0_3d.data(), 48).ok());
    // Boxes cut along dim 1 (tensor parallel): kept as given. Each half's bytes are its own rows.
    std::vector<float> left, right;
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 6; ++c) (c < 3 ? left : right).push_back(cols[static_cast<size_t>(r * 6 + c)]);
    }
    ASSERT_TRUE(out->AddPiece(1, "cols", DType::kFloat32, {2, 6}, Layout::Box({0, 0}, {2, 3}), left.data(), 24).ok());
    ASSERT_TRUE(out->AddPiece(2, "cols", DType::kFloat32, {2, 6}, Layout::Box({0, 3}, {2, 3}), right.data(), 24).ok());
    ASSERT_TRUE(out->AddAlias("rows_tied", "rows").ok());
    ASSERT_TRUE(out->Commit(MakeCreationInfo(1, "", "", {})).ok());
  }
  const std::string ckpt = JoinPath(root, "step-000000001");
  Result<Manifest> m = ReadManifest(ckpt);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->files.size(), 3u);
  ASSERT_EQ(m->entries.size(), 6u);
  auto layouts = [&](size_t entry) {
    std::vector<std::pair<uint32_t, Layout>> out;
    for (const ChunkRecord& c : m->entries[entry].chunks) out.emplace_back(c.file, Normalize(c.layout, m->entries[entry].shape));
    return out;
  };
  using Chunks = std::vector<std::pair<uint32_t, Layout>>;
  EXPECT_EQ(m->entries[0].name, "scalar");
  EXPECT_EQ(layouts(0), (Chunks{{0, Layout::Whole()}}));
  EXPECT_EQ(m->entries[1].name, "flat");
  EXPECT_EQ(layouts(1), (Chunks{{0, Layout::FlatRange(0, 6)}, {2, Layout::FlatRange(6, 10)}}));
  EXPECT_EQ(m->entries[2].name, "rows");
  EXPECT_EQ(layouts(2), (Chunks{{0, Layout::Box({0, 0}, {3, 3})}, {1, Layout::Box({3, 0}, {1, 3})}}));
  EXPECT_EQ(m->entries[3].name, "dim0_3d");
  EXPECT_EQ(layouts(3), (Chunks{{1, Layout::Whole()}}));
  EXPECT_EQ(m->entries[4].name, "cols");
  EXPECT_EQ(layouts(4), (Chunks{{1, Layout::Box({0, 0}, {2, 3})}, {2, Layout::Box({0, 3}, {2, 3})}}));
  EXPECT_EQ(m->entries[5].name, "rows_tied");
  EXPECT_EQ(layouts(5), layouts(2));
  EXPECT_EQ(m->entries[5].chunks[1].offset, m->entries[2].chunks[1].offset);

  std::vector<std::vector<float>> got = {std::vector<float>(1), std::vector<float>(10), std::vector<float>(12),
                                         std::vector<float>(12), std::vector<float>(12), std::vector<float>(12)};
  ShardedState targets;
  ASSERT_TRUE(targets.AddTensor("scalar", DType::kFloat32, {}, Layout::Whole(), got[0].data()).ok());
  ASSERT_TRUE(targets.AddTensor("flat", DType::kFloat32, {10}, Layout::Whole(), got[1].data()).ok());
  ASSERT_TRUE(targets.AddTensor("rows", DType::kFloat32, {4, 3}, Layout::Whole(), got[2].data()).ok());
  ASSERT_TRUE(targets.AddTensor("cols", DType::kFloat32, {2, 6}, Layout::Whole(), got[3].data()).ok());
  ASSERT_TRUE(targets.AddTensor("dim0_3d", DType::kFloat32, {3, 2, 2}, Layout::Whole(), got[4].data()).ok());
  ASSERT_TRUE(targets.AddTensor("rows_tied", DType::kFloat32, {4, 3}, Layout::Whole(), got[5].data()).ok());
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  Result<LoadReport> loaded = Load(*comm, root, targets);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(got[0], scalar);
  EXPECT_EQ(got[1], flat);
  EXPECT_EQ(got[2], rows);
  EXPECT_EQ(got[3], cols);
  EXPECT_EQ(got[4], dim0_3d);
  EXPECT_EQ(got[5], rows);
}

// What a caller added wrongly (a layout whose bytes disagree, pieces that leave a gap) is refused
// at Commit by the check of the built manifest, as a bug of the caller's, and nothing is
// committed. So are layouts whose sizes overflow on the way (a range of 2^61 + 1 float64 elements
// is 8 bytes in 64-bit arithmetic; a row of 2^61 float64 elements is 0 bytes): kept as given,
// never taken for the piece they wrap around to, nor a crash.
TEST(OfflineWriter, ACommitOfPiecesThatDoNotFitTheirEntryIsRefused) {
  struct Case {
    const char* what;
    DType dtype;
    Shape shape;
    Layout layout;
    size_t bytes;
    const char* message;
  };
  const int64_t huge = (int64_t{1} << 61) + 1;
  const std::vector<Case> cases = {
      {"a box of 2 x 3 given 20 bytes", DType::kFloat32, {2, 6}, Layout::Box({0, 0}, {2, 3}), 20,
       "entry 'w' chunk 0 holds 20 bytes but its layout needs 24"},
      {"a flat range given too few bytes", DType::kFloat32, {2, 6}, Layout::FlatRange(0, 12), 40,
       "entry 'w' chunk 0 holds 40 bytes but its layout needs 48"},
      {"rows that leave a gap", DType::kFloat32, {2, 6}, Layout::Box({0, 0}, {1, 6}), 24, "entry 'w'"},
      {"a flat range of 2^61 + 1 elements", DType::kFloat64, {16}, Layout::FlatRange(0, huge), 8, "entry 'w' chunk 0"},
      {"a flat range from the lowest int64", DType::kFloat64, {16}, Layout::FlatRange(INT64_MIN, 1), 8, "entry 'w' chunk 0"},
      {"a row of 2^61 elements", DType::kFloat64, {2, int64_t{1} << 61}, Layout::Box({0, 0}, {1, int64_t{1} << 61}), 8,
       "entry 'w': "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    testing::TempDir dir;
    const std::string root = JoinPath(dir.path(), "root");
    const std::vector<float> values = Values(12, 0);
    auto out = OfflineCheckpointWriter::Begin(root, 1, 1).value();
    ASSERT_TRUE(out->AddPiece(0, "w", c.dtype, c.shape, c.layout, values.data(), c.bytes).ok());
    Result<std::string> committed = out->Commit(MakeCreationInfo(1, "", "", {}));
    ASSERT_FALSE(committed.ok());
    EXPECT_EQ(committed.status().code(), Code::kInternal);
    EXPECT_THAT(committed.status().message(), HasSubstr("the manifest built for this checkpoint is invalid (a bug)"));
    EXPECT_THAT(committed.status().message(), HasSubstr(c.message));
    EXPECT_FALSE(PathExists(JoinPath(root, "step-000000001")));
    EXPECT_FALSE(PathExists(JoinPath(root, "latest")));
  }
}

// An alias of an alias points at the chunks of the entry the first one names.
TEST(OfflineWriter, AnAliasOfAnAliasHoldsItsTargetsChunks) {
  testing::TempDir dir;
  const std::string root = JoinPath(dir.path(), "root");
  const std::vector<float> values = Values(6, 0);
  auto out = OfflineCheckpointWriter::Begin(root, 1, 2).value();
  ASSERT_TRUE(out->AddPiece(0, "a", DType::kFloat32, {6}, Layout::FlatRange(0, 4), values.data(), 16).ok());
  ASSERT_TRUE(out->AddPiece(1, "a", DType::kFloat32, {6}, Layout::FlatRange(4, 6), values.data() + 4, 8).ok());
  ASSERT_TRUE(out->AddAlias("b", "a").ok());
  ASSERT_TRUE(out->AddAlias("c", "b").ok());
  Result<std::string> committed = out->Commit(MakeCreationInfo(1, "", "", {}));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  Result<Manifest> m = ReadManifest(*committed);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->entries.size(), 3u);
  for (size_t i : {1, 2}) {
    ASSERT_EQ(m->entries[i].chunks.size(), 2u) << m->entries[i].name;
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(m->entries[i].chunks[k].file, m->entries[0].chunks[k].file);
      EXPECT_EQ(m->entries[i].chunks[k].offset, m->entries[0].chunks[k].offset);
      EXPECT_EQ(m->entries[i].chunks[k].layout, m->entries[0].chunks[k].layout);
    }
  }
}

// The refusals come in the order a whole manifest's validation and encoding meet them: an
// invalid entry before a name that is not UTF-8 at an earlier entry, an entry before a blob.
TEST(OfflineWriter, ACommitRefusesInTheOrderValidationAndEncodingDo) {
  const std::vector<float> values = Values(4, 0);
  auto commit = [&](bool bad_name, bool bad_entry, bool twice_blob) {
    testing::TempDir dir;
    auto out = OfflineCheckpointWriter::Begin(JoinPath(dir.path(), "root"), 1, 1).value();
    EXPECT_TRUE(out->AddPiece(0, bad_name ? "a\xff" : "a", DType::kFloat32, {4}, Layout::Whole(), values.data(), 16).ok());
    EXPECT_TRUE(out->AddPiece(0, "b", DType::kFloat32, {4}, Layout::FlatRange(0, bad_entry ? 2 : 4), values.data(),
                              bad_entry ? 8 : 16).ok());
    EXPECT_TRUE(out->AddBlob(0, "v", BlobScope::kGlobal, "x").ok());
    if (twice_blob) EXPECT_TRUE(out->AddBlob(0, "v", BlobScope::kGlobal, "y").ok());
    return out->Commit(MakeCreationInfo(1, "", "", {})).status();
  };
  Status s = commit(true, true, true);
  EXPECT_EQ(s.code(), Code::kInternal) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("entry 'b'"));
  s = commit(false, false, true);
  EXPECT_EQ(s.code(), Code::kInternal) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("blob 'v' is listed twice"));
  s = commit(true, false, false);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("the name of entry 0 is not valid UTF-8"));
  EXPECT_TRUE(commit(false, false, false).ok());
}

}  // namespace
}  // namespace shardckpt
