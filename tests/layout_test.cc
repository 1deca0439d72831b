#include "shardckpt/engine/model/layout.h"
#include "shardckpt/engine/model/coverage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <tuple>

namespace shardckpt {
namespace {

using ::testing::ElementsAre;

struct Box {
  std::vector<int64_t> lo, size;
  bool operator==(const Box& o) const { return lo == o.lo && size == o.size; }
};
std::ostream& operator<<(std::ostream& out, const Box& b) {
  return out << "lo" << ShapeString(b.lo) << " size" << ShapeString(b.size);
}

std::vector<Box> Boxes(const Layout& layout, const Shape& shape) {
  std::vector<Box> out;
  for (const Region& r : LayoutRegions(layout, shape)) out.push_back(Box{r.lo, r.size});
  return out;
}

// Dims keeps up to four values inline and spills to the heap past that; every operation must
// read the same whichever side the values live on, across copies and moves of either kind.
TEST(Dims, BehavesAsAVectorInlineAndOnTheHeap) {
  for (size_t n : {0u, 1u, 3u, 4u, 5u, 9u, 33u}) {
    std::vector<int64_t> expected;
    Dims dims;
    for (size_t i = 0; i < n; ++i) {
      dims.push_back(static_cast<int64_t>(i * 7 - 3));
      expected.push_back(static_cast<int64_t>(i * 7 - 3));
    }
    ASSERT_EQ(dims.size(), n);
    EXPECT_EQ(std::vector<int64_t>(dims), expected) << n;
    Dims copy = dims;
    EXPECT_TRUE(copy == dims);
    Dims moved = std::move(copy);
    EXPECT_EQ(std::vector<int64_t>(moved), expected) << n;
    EXPECT_TRUE(copy.empty());  // NOLINT: a moved-from Dims is empty and usable
    copy.push_back(1);
    EXPECT_EQ(std::vector<int64_t>(copy), std::vector<int64_t>{1});
    Dims assigned{9, 9};
    assigned = moved;  // copy-assign over a smaller one
    EXPECT_EQ(std::vector<int64_t>(assigned), expected);
    Dims big(std::vector<int64_t>(12, 5));
    big = std::move(assigned);  // move-assign over a heap one
    EXPECT_EQ(std::vector<int64_t>(big), expected);
    big.resize(n + 2, 8);
    expected.resize(n + 2, 8);
    EXPECT_EQ(std::vector<int64_t>(big), expected);
    Dims from_vector = expected;
    EXPECT_TRUE(from_vector == big);
    from_vector[0] = 100;
    EXPECT_TRUE(from_vector != big);
  }
  Layout box = Layout::Box({0, 2, 0, 0, 1}, {4, 2, 3, 3, 1});  // five dims: on the heap
  EXPECT_EQ(box.ToString(), "box(offsets=[0, 2, 0, 0, 1], sizes=[4, 2, 3, 3, 1])");
  EXPECT_EQ(ValidateLayout(box, {4, 4, 3, 3, 2}).value(), 72);
  EXPECT_EQ(LocalShape(box, {4, 4, 3, 3, 2}), (Shape{4, 2, 3, 3, 1}));
}

TEST(LayoutRegions, FlatRangeSplitsIntoPartialRowsAndFullBlocks) {
  // Shape [4, 5]: elements 3..17 are the tail of row 0 (cols 3-4), rows 1-2 whole, and the head
  // of row 3 (cols 0-1: elements 15, 16).
  EXPECT_THAT(Boxes(Layout::FlatRange(3, 17), {4, 5}),
              ElementsAre(Box{{0, 3}, {1, 2}}, Box{{1, 0}, {2, 5}}, Box{{3, 0}, {1, 2}}));
  // Aligned to rows: one box.
  EXPECT_THAT(Boxes(Layout::FlatRange(5, 15), {4, 5}), ElementsAre(Box{{1, 0}, {2, 5}}));
  // Inside one row.
  EXPECT_THAT(Boxes(Layout::FlatRange(6, 8), {4, 5}), ElementsAre(Box{{1, 1}, {1, 2}}));
  // Whole tensor.
  EXPECT_THAT(Boxes(Layout::FlatRange(0, 20), {4, 5}), ElementsAre(Box{{0, 0}, {4, 5}}));
  // Empty range: no regions.
  EXPECT_TRUE(Boxes(Layout::FlatRange(7, 7), {4, 5}).empty());
}

TEST(LayoutRegions, FlatRangeIn3DUsesAtMostTwoNMinusOneBoxes) {
  // [2, 3, 4] = 24 elements; 5..22: row (0,1) cols 1-3, row (0,2) whole, plane 1 rows 0-1
  // whole, row (1,2) cols 0-1 (elements 20, 21).
  EXPECT_THAT(Boxes(Layout::FlatRange(5, 22), {2, 3, 4}),
              ElementsAre(Box{{0, 1, 1}, {1, 1, 3}}, Box{{0, 2, 0}, {1, 1, 4}}, Box{{1, 0, 0}, {1, 2, 4}},
                          Box{{1, 2, 0}, {1, 1, 2}}));
}

TEST(LayoutRegions, ScalarAndEmpty) {
  EXPECT_EQ(LayoutRegions(Layout::Whole(), {}).size(), 1u);
  EXPECT_EQ(LayoutRegions(Layout::FlatRange(0, 1), {}).size(), 1u);
  EXPECT_TRUE(LayoutRegions(Layout::Whole(), {0, 4}).empty());
  EXPECT_TRUE(LayoutRegions(Layout::Box({2, 0}, {0, 3}), {4, 3}).empty());
}

using Copy = std::tuple<int64_t, int64_t, int64_t>;
std::vector<Copy> Copies(const Layout& src, const Layout& dst, const Shape& shape) {
  std::vector<Copy> out;
  for (const Region& s : LayoutRegions(src, shape)) {
    for (const Region& d : LayoutRegions(dst, shape)) {
      ForEachCopy(s, d, [&](int64_t a, int64_t b, int64_t n) { out.emplace_back(a, b, n); });
    }
  }
  return out;
}

TEST(ForEachCopy, RowSplitsMergeIntoOneRun) {
  // Saved rows 0-3 of [8, 6]; wanted rows 2-5: rows 2-3 are one contiguous run of 12 elements,
  // at offset 12 in the source and 0 in the destination.
  EXPECT_THAT(Copies(Layout::Box({0, 0}, {4, 6}), Layout::Box({2, 0}, {4, 6}), {8, 6}),
              ElementsAre(Copy{12, 0, 12}));
}

TEST(ForEachCopy, ColumnSplitCopiesOneRunPerRow) {
  // Saved as rows 0-1 whole ([2, 4]); wanted columns 2-3 of all rows: two runs of 2.
  EXPECT_THAT(Copies(Layout::Box({0, 0}, {2, 4}), Layout::Box({0, 2}, {4, 2}), {4, 4}),
              ElementsAre(Copy{2, 0, 2}, Copy{6, 2, 2}));
}

TEST(ForEachCopy, FlatRangeIntoBox) {
  // Saved flat [3, 9) of [3, 4]; wanted box rows 1-2 cols 1-2. Flat offset = linear - 3.
  // Row 1 cols 1-2 = linear 5, 6 -> src 2; row 2 cols 1-2 = linear 9, 10 -> not saved here.
  EXPECT_THAT(Copies(Layout::FlatRange(3, 9), Layout::Box({1, 1}, {2, 2}), {3, 4}),
              ElementsAre(Copy{2, 0, 2}));
}

TEST(ForEachCopy, FlatIntoFlat) {
  EXPECT_THAT(Copies(Layout::FlatRange(0, 10), Layout::FlatRange(7, 13), {20}), ElementsAre(Copy{7, 0, 3}));
}

TEST(Chunking, FollowsTorchChunk) {
  // torch.chunk(10 rows, 4) -> 3, 3, 3, 1
  EXPECT_EQ(ChunkLayout({10, 2}, 0, 4, 0).sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(ChunkLayout({10, 2}, 0, 4, 3).sizes, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ChunkLayout({10, 2}, 0, 4, 3).offsets, (std::vector<int64_t>{9, 0}));
  // torch.chunk(2 rows, 4) -> 1, 1 and then empty pieces
  EXPECT_EQ(ChunkLayout({2, 2}, 0, 4, 3).sizes, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(FlatShardLayout({10}, 4, 3), Layout::FlatRange(9, 10));
  EXPECT_EQ(FlatShardLayout({2}, 4, 3), Layout::FlatRange(2, 2));
}

// A valid request (error "") gives the same layout both ways; a bad one is refused naming the
// cause, and the unchecked form returns a layout that validation refuses.
void ExpectChecked(const Result<Layout>& checked, const Layout& unchecked, const Shape& shape, const char* error) {
  if (*error == '\0') {
    ASSERT_TRUE(checked.ok()) << checked.status().ToString();
    EXPECT_EQ(*checked, unchecked);
    return;
  }
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(checked.status().message(), ::testing::HasSubstr(error));
  EXPECT_FALSE(ValidateLayout(unchecked, shape).ok()) << unchecked.ToString();
}

// RunPieces gives, in one call, the pieces ChunkLayout/FlatShardLayout give one rank at a time,
// where each lies in the whole tensor, and stops at the first empty piece after piece 0.
TEST(Chunking, RunPiecesAreThePerRankLayoutsUpToTheFirstEmpty) {
  struct Case {
    Shape shape;
    int parts;
    size_t expected_pieces;  // dim0 / flat
    size_t expected_flat;
  };
  const std::vector<Case> cases = {
      {{10, 2}, 4, 4, 4}, {{2, 2}, 4, 2, 4}, {{0, 3}, 3, 1, 1}, {{4, 0}, 2, 1, 1}, {{7}, 1, 1, 1},
      {{5, 3, 2}, 8, 5, 8}, {{1}, 64, 1, 1}, {{}, 4, 1, 1},    {{3, 1, 1, 1, 2}, 2, 2, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ShapeString(c.shape) + " in " + std::to_string(c.parts));
    const int64_t numel = NumElements(c.shape).value();
    for (bool dim0 : {true, false}) {
      Result<std::vector<RunPiece>> pieces = RunPieces(c.shape, c.parts, dim0);
      ASSERT_TRUE(pieces.ok()) << pieces.status().ToString();
      EXPECT_EQ(pieces->size(), dim0 ? c.expected_pieces : c.expected_flat) << (dim0 ? "dim0" : "flat");
      int64_t next = 0;
      for (size_t i = 0; i < pieces->size(); ++i) {
        const RunPiece& p = (*pieces)[i];
        const Layout expected = dim0 ? (c.shape.empty() ? Layout::Whole() : ChunkLayout(c.shape, 0, c.parts, static_cast<int>(i)))
                                     : FlatShardLayout(c.shape, c.parts, static_cast<int>(i));
        EXPECT_EQ(p.layout, expected) << "piece " << i;
        EXPECT_EQ(p.count, ValidateLayout(expected, c.shape).value()) << "piece " << i;
        EXPECT_EQ(p.first, ContiguousStart(expected, c.shape)) << "piece " << i;
        EXPECT_EQ(p.first, next) << "pieces follow each other";
        next = p.first + p.count;
        if (i > 0) {
          EXPECT_GT(p.count, 0) << "only piece 0 may be empty";
        }
      }
      EXPECT_EQ(next, numel) << "the pieces cover the tensor";
    }
  }
  EXPECT_THAT(RunPieces({4}, 0, true).status().message(), ::testing::HasSubstr("pieces of shape [4]"));
  EXPECT_FALSE(RunPieces({-1, 2}, 2, false).ok());
}

// Parts of a piece (an import writes a large piece part by part): valid layouts of the tensor,
// following each other over exactly the piece, each within the bound unless one unit (a row)
// alone is larger.
TEST(Chunking, SplitRunPieceCutsAPieceIntoRunsWithinTheBound) {
  struct Case {
    Shape shape;
    bool dim0;
    uint64_t max_bytes;
    size_t parts;  // of piece 1 of 3 (float32)
  };
  const std::vector<Case> cases = {
      {{30, 10}, true, 400, 1},   // 10 rows of 40 bytes: within the bound, the piece itself
      {{30, 10}, true, 100, 5},   // 2 rows per part
      {{30, 10}, true, 10, 10},   // a row (40 bytes) alone is larger: one row per part
      {{30, 10}, false, 40, 10},  // 100 elements, 10 per part
      {{30, 10}, false, 396, 2},  // 99 per part: 99 + 1
      {{7}, false, 4, 3},         // elements 3..5, one per part
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ShapeString(c.shape) + (c.dim0 ? " dim0 " : " flat ") + std::to_string(c.max_bytes));
    const RunPiece piece = RunPieces(c.shape, 3, c.dim0).value()[1];
    const std::vector<RunPiece> parts = SplitRunPiece(piece, 4, c.max_bytes);
    ASSERT_EQ(parts.size(), c.parts);
    int64_t next = piece.first;
    for (const RunPiece& part : parts) {
      EXPECT_EQ(part.count, ValidateLayout(part.layout, c.shape).value());
      EXPECT_EQ(part.first, ContiguousStart(part.layout, c.shape));
      EXPECT_EQ(part.first, next);
      EXPECT_EQ(part.layout.kind, piece.layout.kind);
      next = part.first + part.count;
    }
    EXPECT_EQ(next, piece.first + piece.count);
  }
  const RunPiece whole{Layout::Whole(), 0, 100};
  EXPECT_EQ(SplitRunPiece(whole, 4, 8).size(), 1u);
}

TEST(Chunking, RefusesBadDimPartsAndIndex) {
  struct Case {
    Shape shape;
    int dim, parts, index;
    const char* error;  // "" when valid
  };
  const Case kCases[] = {
      {{10, 2}, 0, 4, 3, ""},
      {{10, 2}, 2, 4, 0, "chunk dim 2 is outside shape [10, 2]"},
      {{10, 2}, -1, 4, 0, "chunk dim -1 is outside shape [10, 2]"},
      {{}, 0, 1, 0, "chunk dim 0 is outside shape []"},
      {{10, 2}, 0, 0, 0, "parts is 0; it must be at least 1"},
      {{10, 2}, 0, -3, 0, "parts is -3"},
      {{10, 2}, 0, 4, 4, "index 4 is outside [0, 4)"},
      {{10, 2}, 0, 4, -1, "index -1 is outside [0, 4)"},
      {{-5, 2}, 0, 4, 0, "negative dim"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(ShapeString(c.shape) + " dim " + std::to_string(c.dim) + " parts " + std::to_string(c.parts) +
                 " index " + std::to_string(c.index));
    ExpectChecked(CheckedChunkLayout(c.shape, c.dim, c.parts, c.index), ChunkLayout(c.shape, c.dim, c.parts, c.index),
                  c.shape, c.error);
  }
}

TEST(Chunking, FlatShardRefusesBadPartsAndIndex) {
  struct Case {
    Shape shape;
    int parts, index;
    const char* error;
  };
  const Case kCases[] = {
      {{10}, 4, 0, ""},
      {{}, 1, 0, ""},
      {{10}, 0, 0, "parts is 0; it must be at least 1"},
      {{10}, -2, 0, "parts is -2"},
      {{10}, 4, 4, "index 4 is outside [0, 4)"},
      {{10}, 4, -1, "index -1 is outside [0, 4)"},
      {{3, -1}, 2, 0, "negative dim"},
      {{int64_t{1} << 40, int64_t{1} << 40}, 2, 0, "too large"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(ShapeString(c.shape) + " parts " + std::to_string(c.parts) + " index " + std::to_string(c.index));
    ExpectChecked(CheckedFlatShardLayout(c.shape, c.parts, c.index), FlatShardLayout(c.shape, c.parts, c.index),
                  c.shape, c.error);
  }
}

TEST(Validation, RejectsOutOfBoundsAndOverflow) {
  EXPECT_FALSE(ValidateLayout(Layout::Box({3}, {2}), {4}).ok());
  EXPECT_FALSE(ValidateLayout(Layout::Box({-1}, {2}), {4}).ok());
  EXPECT_FALSE(ValidateLayout(Layout::Box({0, 0}, {1}), {4, 4}).ok());
  EXPECT_FALSE(ValidateLayout(Layout::FlatRange(2, 1), {4}).ok());
  EXPECT_FALSE(ValidateLayout(Layout::FlatRange(0, 5), {4}).ok());
  Result<int64_t> huge = NumBytes({int64_t{1} << 40, int64_t{1} << 40}, 4);
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), ::testing::HasSubstr("too large"));
  EXPECT_FALSE(NumElements({-3}).ok());
  EXPECT_EQ(*ValidateLayout(Layout::Box({1, 0}, {2, 3}), {4, 3}), 6);
}

// PartsCoverWhole against marking every element of random parts (boxes, ranges, whole) of random
// shapes, overlaps allowed; and its run budget.
// Pieces whose overlap check would take hours (single elements of a [2]*14 tensor: the index's
// key dim has two starts, so each box is tested against half the others) are refused once the
// check's work passes its bound; a real grid of as many boxes is checked.
TEST(ExactCover, PiecesTooCostlyToCheckAreRefusedAndRealGridsAreNot) {
  const Shape cube(14, 2);
  std::vector<Layout> cells;
  std::vector<std::string> owners;
  for (int64_t i = 0; i < (int64_t{1} << 14); ++i) {
    Dims offsets;
    for (int d = 13; d >= 0; --d) offsets.push_back((i >> d) & 1);
    cells.push_back(Layout::Box(offsets, Dims(std::vector<int64_t>(14, 1))));
    owners.push_back("piece " + std::to_string(i));
  }
  Status refused = CheckExactCover("cube", cube, cells, owners);
  EXPECT_EQ(refused.code(), Code::kInvalidArgument);
  EXPECT_NE(refused.message().find("entry 'cube': its 16384 pieces (16384 boxes) take more than 67108864 box tests"),
            std::string::npos)
      << refused.message();
  const Shape plane = {128, 128};
  std::vector<Layout> grid;
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) grid.push_back(Layout::Box({r, c}, {1, 1}));
  }
  EXPECT_TRUE(CheckExactCover("plane", plane, grid, std::vector<std::string>(grid.size(), "p")).ok());
}

TEST(PartsCoverWhole, MatchesMarkingEveryElement) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t dims = rng() % 4;
    Shape shape(dims);
    for (int64_t& n : shape) n = static_cast<int64_t>(rng() % 5);
    const int64_t numel = NumElements(shape).value();
    std::vector<Layout> parts;
    std::vector<bool> held(static_cast<size_t>(numel), false);
    const int count = static_cast<int>(rng() % 4);
    for (int p = 0; p < count; ++p) {
      Layout part;
      if (rng() % 3 == 0) {
        const int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel + 1));
        part = Layout::FlatRange(b, b + static_cast<int64_t>(rng() % static_cast<uint64_t>(numel - b + 1)));
        for (int64_t l = part.begin; l < part.end; ++l) held[static_cast<size_t>(l)] = true;
      } else {
        Dims offsets, sizes;
        for (int64_t n : shape) {
          const int64_t o = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
          offsets.push_back(o);
          sizes.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(n - o + 1)));
        }
        part = Layout::Box(offsets, sizes);
        for (const Region& r : LayoutRegions(part, shape)) {
          // Every index of the region's box, row-major in the global shape.
          int64_t cells = 1;
          for (int64_t n : r.size) cells *= n;
          for (int64_t c = 0; c < cells; ++c) {
            int64_t rest = c, l = 0;
            std::vector<int64_t> at(r.size.size());
            for (size_t d = r.size.size(); d-- > 0;) {
              at[d] = rest % r.size[d];
              rest /= r.size[d];
            }
            for (size_t d = 0; d < shape.size(); ++d) l = l * shape[d] + r.lo[d] + at[d];
            held[static_cast<size_t>(l)] = true;
          }
        }
      }
      parts.push_back(part);
    }
    const bool all = std::all_of(held.begin(), held.end(), [](bool h) { return h; });
    const std::optional<bool> covered = PartsCoverWhole(parts, shape, 1 << 20);
    ASSERT_TRUE(covered.has_value());
    EXPECT_EQ(*covered, all) << ShapeString(shape) << ", " << parts.size() << " parts, first "
                             << (parts.empty() ? std::string("none") : parts[0].ToString());
  }
  // A column half of a [1000, 10] is 1000 runs: over a budget of 10, no answer.
  const Shape wide = {1000, 10};
  EXPECT_FALSE(PartsCoverWhole({Layout::Box({0, 0}, {1000, 5})}, wide, 10).has_value());
  EXPECT_EQ(PartsCoverWhole({Layout::Box({0, 0}, {1000, 5}), Layout::Box({0, 4}, {1000, 6})}, wide, 5000), true);
  EXPECT_EQ(PartsCoverWhole({Layout::FlatRange(0, 2), Layout::FlatRange(0, 2)}, {3}, 10), false);
  EXPECT_EQ(PartsCoverWhole({}, {0, 4}, 10), true);  // nothing to hold
  EXPECT_EQ(PartsCoverWhole({}, {}, 10), false);     // a scalar's one element
  // A box of another shape (a piece the match refused) gives no answer, never a read past its dims.
  EXPECT_FALSE(PartsCoverWhole({Layout::Box({0, 0}, {1, 7})}, {1, 1, 7}, 10).has_value());
}

}  // namespace
}  // namespace shardckpt
