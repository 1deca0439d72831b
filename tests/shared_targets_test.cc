// FindSharedTargets and OverlapRefusal (engine/model/shared_targets.h): pieces placed in one buffer.
#include "shardckpt/engine/model/shared_targets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

struct Placed {
  const char* name;
  size_t at, bytes;  // in the buffer
  MemorySpace space = MemorySpace::kHost;
  int device = 0;
};

std::vector<TensorPiece> PiecesIn(unsigned char* buffer, const std::vector<Placed>& placed) {
  std::vector<TensorPiece> pieces;
  for (const Placed& p : placed) {
    TensorPiece piece;
    piece.name = p.name;
    piece.data = buffer + p.at;
    piece.bytes = static_cast<int64_t>(p.bytes);
    piece.space = p.space;
    piece.device = p.device;
    pieces.push_back(piece);
  }
  return pieces;
}

TEST(FindSharedTargets, PairsPiecesOverTheSameBytesAndEveryOverlap) {
  unsigned char buffer[64];
  using Pairs = std::vector<std::pair<size_t, size_t>>;
  struct Case {
    const char* what;
    std::vector<Placed> pieces;
    Pairs same, overlapping;
  } cases[] = {
      {"apart", {{"a", 0, 16}, {"b", 16, 16}, {"c", 40, 8}}, {}, {}},
      {"tied", {{"wte", 0, 32}, {"lm_head", 0, 32}}, {{1, 0}}, {}},
      {"tied, listed later first", {{"x", 40, 8}, {"lm_head", 0, 32}, {"wte", 0, 32}}, {{2, 1}}, {}},
      {"three names", {{"a", 8, 8}, {"b", 8, 8}, {"c", 8, 8}}, {{1, 0}, {2, 0}}, {}},
      {"empty pieces share nothing", {{"a", 0, 0}, {"b", 0, 16}, {"c", 0, 0}}, {}, {}},
      {"another device", {{"a", 0, 16}, {"b", 0, 16, MemorySpace::kCuda, 0}, {"c", 0, 16, MemorySpace::kCuda, 1}}, {}, {}},
      {"same start, other size", {{"a", 0, 32}, {"b", 0, 16}}, {}, {{1, 0}}},
      {"views of one buffer", {{"a", 0, 24}, {"b", 16, 24}}, {}, {{1, 0}}},
      {"inside a larger one, after a tie", {{"big", 0, 48}, {"tie", 0, 48}, {"small", 40, 4}}, {{1, 0}}, {{2, 0}}},
      // c overlaps a, which is not the piece reaching farthest (b): every overlapping piece is paired.
      {"a chain", {{"a", 0, 20}, {"b", 4, 40}, {"c", 16, 2}}, {}, {{1, 0}, {2, 1}}},
  };
  for (const Case& c : cases) {
    const SharedTargets shared = FindSharedTargets(PiecesIn(buffer, c.pieces));
    EXPECT_EQ(shared.same, c.same) << c.what;
    EXPECT_EQ(shared.overlapping, c.overlapping) << c.what;
  }
}

// A load looks again among the pieces it writes (those the checkpoint holds): a piece it leaves
// alone shares memory harmlessly.
TEST(FindSharedTargets, AmongSomePiecesOnly) {
  unsigned char buffer[64];
  const std::vector<TensorPiece> pieces =
      PiecesIn(buffer, {{"w", 0, 32}, {"missing", 0, 8}, {"tied", 0, 32}, {"other", 40, 8}});
  const SharedTargets all = FindSharedTargets(pieces);
  EXPECT_EQ(all.same, (std::vector<std::pair<size_t, size_t>>{{2, 0}}));
  EXPECT_EQ(all.overlapping, (std::vector<std::pair<size_t, size_t>>{{1, 0}}));
  const std::vector<size_t> written = {0, 2, 3};
  const SharedTargets some = FindSharedTargets(pieces, &written);
  EXPECT_EQ(some.same, (std::vector<std::pair<size_t, size_t>>{{2, 0}}));
  EXPECT_TRUE(some.overlapping.empty());
}

TEST(OverlapRefusal, NamesBothPiecesAndWhatToDo) {
  unsigned char buffer[64];
  const std::vector<TensorPiece> pieces = PiecesIn(buffer, {{"a", 0, 24}, {"b", 16, 24}, {"w", 40, 8}, {"w", 44, 8}});
  const Status ab = OverlapRefusal(pieces, {1, 0});
  EXPECT_EQ(ab.code(), Code::kInvalidArgument);
  EXPECT_THAT(ab.message(), HasSubstr("tensors 'a' and 'b' of the state passed overlap in memory without being the same "
                                      "bytes ('a' (24 bytes at "));
  EXPECT_THAT(ab.message(), HasSubstr("load into tensors of their own"));
  EXPECT_THAT(OverlapRefusal(pieces, {3, 2}).message(), HasSubstr("two pieces of tensor 'w' of the state passed"));
}

}  // namespace
}  // namespace shardckpt
