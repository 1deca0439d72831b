#include "shardckpt/engine/model/save_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PieceDescription Piece(const std::string& name, const Shape& shape, const Layout& layout,
                       DType dtype = DType::kFloat32) {
  int64_t count = *ValidateLayout(layout, shape);
  return PieceDescription{name, dtype, shape, layout, count * static_cast<int64_t>(DTypeSize(dtype))};
}

TEST(PlanSave, ShardedPiecesAreWrittenByTheirOwners) {
  std::vector<RankDescription> ranks(2);
  ranks[0].pieces = {Piece("w", {4, 4}, Layout::FlatRange(0, 8))};
  ranks[1].pieces = {Piece("w", {4, 4}, Layout::FlatRange(8, 16))};
  Result<SavePlan> plan = PlanSave(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->writes_piece[0], ElementsAre(true));
  EXPECT_THAT(plan->writes_piece[1], ElementsAre(true));
  EXPECT_THAT(plan->bytes_per_rank, ElementsAre(32, 32));
}

TEST(PlanSave, ReplicasAreWrittenOnceAndSpreadAcrossRanks) {
  // Four ranks hold the same four replicated tensors of 400, 300, 200 and 100 bytes. Largest
  // first, each goes to the rank with the fewest bytes so far: one tensor per rank.
  std::vector<RankDescription> ranks(4);
  for (auto& r : ranks) {
    r.pieces = {Piece("a", {100}, Layout::Whole()), Piece("b", {75}, Layout::Whole()),
                Piece("c", {50}, Layout::Whole()), Piece("d", {25}, Layout::Box({0}, {25}))};
  }
  Result<SavePlan> plan = PlanSave(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  int writers_per_piece[4] = {};
  for (int r = 0; r < 4; ++r) {
    int written = 0;
    for (int i = 0; i < 4; ++i) {
      writers_per_piece[i] += plan->writes_piece[r][i];
      written += plan->writes_piece[r][i];
    }
    EXPECT_EQ(written, 1) << "rank " << r;
  }
  EXPECT_THAT(writers_per_piece, ElementsAre(1, 1, 1, 1));  // the full Box counts as a replica
}

TEST(PlanSave, DataParallelReplicasOfShardsAreDeduplicated) {
  // 2 data-parallel groups x 2 shards: ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1.
  std::vector<RankDescription> ranks(4);
  for (int r = 0; r < 4; ++r) ranks[r].pieces = {Piece("w", {8}, FlatShardLayout({8}, 2, r % 2))};
  SavePlan plan = PlanSave(ranks).value();
  EXPECT_EQ(plan.writes_piece[0][0] + plan.writes_piece[2][0], 1);
  EXPECT_EQ(plan.writes_piece[1][0] + plan.writes_piece[3][0], 1);
}

TEST(PlanSave, GlobalBlobsOnceAndPerRankBlobsEverywhere) {
  std::vector<RankDescription> ranks(3);
  for (auto& r : ranks) {
    r.blobs = {BlobDescription{"step", BlobScope::kGlobal, 8}, BlobDescription{"rng", BlobScope::kPerRank, 16}};
  }
  SavePlan plan = PlanSave(ranks).value();
  EXPECT_THAT(plan.writes_blob[0], ElementsAre(true, true));
  EXPECT_THAT(plan.writes_blob[1], ElementsAre(false, true));
  EXPECT_THAT(plan.writes_blob[2], ElementsAre(false, true));
}

TEST(PlanSave, RejectsInconsistentOrIncompleteStates) {
  struct Case {
    const char* what;
    std::vector<RankDescription> ranks;
    const char* message;
  };
  std::vector<Case> cases;
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::FlatRange(0, 2))};
    r[1].pieces = {Piece("w", {4}, Layout::FlatRange(2, 4), DType::kFloat16)};
    cases.push_back({"dtype differs", r, "float16 [4] on rank 1 but float32 [4] on rank 0"});
  }
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::FlatRange(0, 2))};
    r[1].pieces = {Piece("w", {5}, Layout::FlatRange(2, 4))};
    cases.push_back({"shape differs", r, "[5] on rank 1"});
  }
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::FlatRange(0, 2))};
    r[1].pieces = {Piece("w", {4}, Layout::FlatRange(3, 4))};
    cases.push_back({"gap", r, "cover 3 of 4 elements (missing pieces): flat[2, 3) is in none"});
  }
  {
    // Rows 0-3 of 10 on rank 0, 4-6 on rank 1, none on rank 2 (it left them out): named.
    std::vector<RankDescription> r(3);
    r[0].pieces = {Piece("w", {10, 7}, Layout::Box({0, 0}, {4, 7}))};
    r[1].pieces = {Piece("w", {10, 7}, Layout::Box({4, 0}, {3, 7}))};
    cases.push_back({"rows left out", r, "cover 49 of 70 elements (missing pieces): element [7, 0] is in none; ranks with "
                                         "no piece of it: 2 (one that should hold a part left the name out of its "
                                         "state?)"});
  }
  {
    // Rank 1 passes rank 0's rows instead of its own: taken as a replica, so rows 3-5 are in none.
    std::vector<RankDescription> r(3);
    r[0].pieces = r[1].pieces = {Piece("w", {9, 2}, Layout::Box({0, 0}, {3, 2}))};
    r[2].pieces = {Piece("w", {9, 2}, Layout::Box({6, 0}, {3, 2}))};
    cases.push_back({"another rank's piece", r,
                     "element [3, 0] is in none; rank 1 passed the same piece box(offsets=[0, 0], sizes=[3, 2]) as "
                     "rank 0 (equal pieces are taken as replicas)"});
  }
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {3, 4}, Layout::Box({0, 0}, {3, 2}))};
    r[1].pieces = {Piece("w", {3, 4}, Layout::Box({1, 2}, {2, 2}))};
    cases.push_back({"a corner left out", r, "cover 10 of 12 elements (missing pieces): element [0, 2] is in none"});
  }
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4, 4}, Layout::Box({0, 0}, {3, 4}))};
    r[1].pieces = {Piece("w", {4, 4}, Layout::FlatRange(8, 16))};
    cases.push_back({"overlap", r, "overlaps"});
  }
  {
    // One rank adding the same piece twice (two buffers): only one of them would be saved.
    // Equal pieces on two ranks are replicas, and stay allowed (the tests above).
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::Whole())};
    r[1].pieces = {Piece("w", {4}, Layout::Whole()), Piece("w", {4}, Layout::Box({0}, {4}))};
    cases.push_back({"one rank's piece twice", r, "rank 1 adds the piece box(offsets=[0], sizes=[4]) twice"});
  }
  {
    std::vector<RankDescription> r(3);
    r[0].pieces = r[1].pieces = r[2].pieces = {Piece("x", {4}, Layout::Whole())};
    r[0].blobs = {BlobDescription{"w", BlobScope::kGlobal, 2}};
    r[1].blobs = {BlobDescription{"w", BlobScope::kGlobal, 2}};
    r[2].blobs = {BlobDescription{"w", BlobScope::kPerRank, 2}};
    cases.push_back({"a value's scope differs", r, "value 'w' is global on rank 0 but per-rank on rank 2"});
  }
  {
    // A tensor on one rank, a value (a PerRank one in Python) on another: both were committed.
    std::vector<RankDescription> r(2);
    r[1].pieces = {Piece("w", {4}, Layout::Whole())};
    r[0].blobs = {BlobDescription{"w", BlobScope::kPerRank, 2}};
    cases.push_back({"a tensor on one rank, a value on another", r, "'w' is a tensor on rank 1 but a value on rank 0"});
  }
  {
    // Both on one rank.
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::Whole())};
    r[0].blobs = {BlobDescription{"w", BlobScope::kGlobal, 2}};
    cases.push_back({"a tensor and a value on one rank", r, "rank 0 saves 'w' both as a tensor and as a value"});
  }
  {
    // A dict holding a tensor on one rank, a plain value under the same key on another.
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w.a", {4}, Layout::Whole())};
    r[1].blobs = {BlobDescription{"w", BlobScope::kGlobal, 2}};
    cases.push_back({"a value above a tensor", r, "'w' is a value on rank 1 but tensor 'w.a' lies under it on rank 0"});
  }
  {
    std::vector<RankDescription> r(2);
    r[0].pieces = {Piece("w", {4}, Layout::Whole())};
    r[1].pieces = {Piece("w", {4}, Layout::Whole())};
    r[1].blobs = {BlobDescription{"w.lr", BlobScope::kGlobal, 2}};
    cases.push_back({"a tensor above a value", r, "'w' is a tensor on rank 0 but value 'w.lr' lies under it on rank 1"});
  }
  for (Case& c : cases) {
    Result<SavePlan> plan = PlanSave(c.ranks);
    ASSERT_FALSE(plan.ok()) << c.what;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(plan.status().message(), HasSubstr("'w'")) << c.what;
  }
}

// Values under a value's path ("rng", "rng.dropout") and names that only begin alike ("w" and
// "w2", "wx.a") are fine; a value "wx" above the tensor "wx.a" is not.
TEST(PlanSave, ValuesUnderValuesAndLookAlikeNamesPass) {
  auto ranks_with = [](bool value_above_tensor) {
    std::vector<RankDescription> ranks(2);
    for (RankDescription& r : ranks) {
      r.pieces = {Piece("w", {4}, Layout::Whole()), Piece("wx.a", {2}, Layout::Whole())};
      r.blobs = {BlobDescription{"rng", BlobScope::kPerRank, 2}, BlobDescription{"rng.dropout", BlobScope::kGlobal, 2},
                 BlobDescription{"w2", BlobScope::kGlobal, 2}};
      if (value_above_tensor) r.blobs.push_back(BlobDescription{"wx", BlobScope::kGlobal, 1});
    }
    return ranks;
  };
  Result<SavePlan> fine = PlanSave(ranks_with(false));
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
  Result<SavePlan> above = PlanSave(ranks_with(true));
  ASSERT_FALSE(above.ok());
  EXPECT_THAT(above.status().message(), HasSubstr("'wx' is a value on rank 0 but tensor 'wx.a' lies under it"));
}

TEST(PlanSave, EncodesAndDecodes) {
  std::vector<RankDescription> ranks(2);
  ranks[0].pieces = {Piece("w", {4}, Layout::Whole())};
  ranks[1].pieces = {Piece("w", {4}, Layout::Whole())};
  ranks[1].blobs = {BlobDescription{"x", BlobScope::kGlobal, 1}};
  SavePlan plan = PlanSave(ranks).value();
  SavePlan back = DecodeSavePlan(EncodeSavePlan(plan), 2).value();
  EXPECT_EQ(back.writes_piece, plan.writes_piece);
  EXPECT_EQ(back.writes_blob, plan.writes_blob);
  EXPECT_EQ(back.bytes_per_rank, plan.bytes_per_rank);
  RankDescription d = DecodeRankDescription(EncodeRankDescription(ranks[1])).value();
  EXPECT_EQ(d.pieces[0].name, "w");
  EXPECT_EQ(d.blobs[0].name, "x");
  EXPECT_FALSE(DecodeRankDescription(EncodeRankDescription(ranks[1]).substr(0, 10)).ok());
}

}  // namespace
}  // namespace shardckpt
