#include "shardckpt/engine/model/index_fingerprint.h"

#include <gtest/gtest.h>

#include <random>

namespace shardckpt {
namespace {

constexpr uint64_t kP = kIndexFingerprintModulus;

// The definition, element by element: the sum of 13^l mod P (13: a primitive root of P), each
// power by plain square-and-multiply in 128 bits.
uint64_t Term(uint64_t l) {
  using U = unsigned __int128;
  U result = 1, base = 13;
  for (uint64_t e = l % (kP - 1); e > 0; e >>= 1, base = base * base % kP) {
    if (e & 1) result = result * base % kP;
  }
  return static_cast<uint64_t>(result);
}

uint64_t BruteForce(const Layout& layout, const Shape& global) {
  if (layout.kind == LayoutKind::kFlatRange) {
    uint64_t f = 0;
    for (int64_t l = layout.begin; l < layout.end; ++l) f = AddIndexFingerprints(f, Term(static_cast<uint64_t>(l)));
    return f;
  }
  const std::vector<int64_t> lo = layout.kind == LayoutKind::kBox ? std::vector<int64_t>(layout.offsets)
                                                                   : std::vector<int64_t>(global.size(), 0);
  const std::vector<int64_t> size = layout.kind == LayoutKind::kBox ? std::vector<int64_t>(layout.sizes) : global;
  for (int64_t n : size) {
    if (n == 0) return 0;
  }
  std::vector<int64_t> at(size.size(), 0);  // odometer over the box
  uint64_t f = 0;
  while (true) {
    uint64_t l = 0;
    for (size_t d = 0; d < global.size(); ++d) l = l * static_cast<uint64_t>(global[d]) + static_cast<uint64_t>(lo[d] + at[d]);
    f = AddIndexFingerprints(f, Term(l));
    size_t d = size.size();
    while (d > 0 && ++at[d - 1] == size[d - 1]) at[--d] = 0;
    if (d == 0) return f;
  }
}

TEST(IndexFingerprint, MatchesTheElementByElementSumOnRandomBoxesAndRanges) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t dims = rng() % 5;  // 0-d (a scalar) to 4-d
    Shape shape(dims);
    for (int64_t& n : shape) n = static_cast<int64_t>(rng() % 6);
    int64_t numel = 1;
    for (int64_t n : shape) numel *= n;
    Dims offsets, sizes;
    for (int64_t n : shape) {
      const int64_t o = n == 0 ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
      offsets.push_back(o);
      sizes.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(n - o + 1)));
    }
    const Layout box = Layout::Box(offsets, sizes);
    EXPECT_EQ(IndexFingerprint(box, shape), BruteForce(box, shape)) << box.ToString() << " of " << ShapeString(shape);
    const int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel + 1));
    const Layout range = Layout::FlatRange(b, b + static_cast<int64_t>(rng() % static_cast<uint64_t>(numel - b + 1)));
    EXPECT_EQ(IndexFingerprint(range, shape), BruteForce(range, shape)) << range.ToString();
    EXPECT_EQ(IndexFingerprint(Layout::Whole(), shape), BruteForce(Layout::Whole(), shape)) << ShapeString(shape);
  }
}

// Indices near 2^50 (the largest tensor a manifest allows): the closed form's exponents, reduced
// mod P - 1, and its geometric sums must come to what the element-by-element sum does.
TEST(IndexFingerprint, MatchesTheElementSumAtLargeIndices) {
  const int64_t big = int64_t{1} << 50;
  const Shape flat = {big};
  for (int64_t b : {big - 1000, big / 2 - 7, int64_t{1} << 33, (int64_t{1} << 32) - 3}) {
    const Layout range = Layout::FlatRange(b, b + 997);
    EXPECT_EQ(IndexFingerprint(range, flat), BruteForce(range, flat)) << b;
    const Layout box = Layout::Box({b}, {997});
    EXPECT_EQ(IndexFingerprint(box, flat), BruteForce(box, flat)) << b;
  }
  const Shape wide = {int64_t{1} << 20, int64_t{1} << 22, 8};
  const Layout corner = Layout::Box({(int64_t{1} << 20) - 3, (int64_t{1} << 22) - 5, 2}, {3, 5, 6});
  EXPECT_EQ(IndexFingerprint(corner, wide), BruteForce(corner, wide));
}

// Any exact split of a tensor sums to the whole tensor's fingerprint (mod P).
TEST(IndexFingerprint, TheSplitsOfATensorSumToTheWhole) {
  const std::vector<Shape> shapes = {{10}, {7, 3}, {5, 4, 3}, {2, 3, 4, 5}, {}, {0, 4}, {1 << 12, 1 << 10}};
  for (const Shape& shape : shapes) {
    const uint64_t whole = IndexFingerprint(Layout::Whole(), shape);
    for (int parts : {1, 2, 3, 7}) {
      uint64_t flat = 0;
      for (int i = 0; i < parts; ++i) flat = AddIndexFingerprints(flat, IndexFingerprint(FlatShardLayout(shape, parts, i), shape));
      EXPECT_EQ(flat, whole) << ShapeString(shape) << " in " << parts << " flat shards";
      for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
        uint64_t chunks = 0;
        for (int i = 0; i < parts; ++i) {
          chunks = AddIndexFingerprints(chunks, IndexFingerprint(ChunkLayout(shape, dim, parts, i), shape));
        }
        EXPECT_EQ(chunks, whole) << ShapeString(shape) << " in " << parts << " chunks along dim " << dim;
      }
    }
  }
}

// The sets a count alone passes: as many elements as the tensor, some twice and some never.
TEST(IndexFingerprint, PartsThatOverlapAndLeaveAGapDoNotSumToTheWhole) {
  struct Case {
    const char* what;
    Shape shape;
    std::vector<Layout> parts;
  };
  std::vector<Case> cases = {
      {"both ranks load shard 0 of 2", {8}, {ChunkLayout({8}, 0, 2, 0), ChunkLayout({8}, 0, 2, 0)}},
      {"both ranks load rows 0-1 of a 4x3", {4, 3}, {Layout::Box({0, 0}, {2, 3}), Layout::Box({0, 0}, {2, 3})}},
      {"both load column block 1 of 2", {4, 6}, {ChunkLayout({4, 6}, 1, 2, 1), ChunkLayout({4, 6}, 1, 2, 1)}},
      {"shifted by one", {4}, {Layout::FlatRange(0, 2), Layout::FlatRange(1, 3)}},
      {"the first element missing, the last twice", {4}, {Layout::FlatRange(1, 4), Layout::FlatRange(3, 4)}},
      {"a symmetric swap: index sums equal, square sums not", {4}, {Layout::FlatRange(1, 3), Layout::FlatRange(1, 3)}},
  };
  // Patterns whose index sums and square sums both match the whole's (an earlier fingerprint of
  // those moments passed them): 8 flat shards where each rank with an odd number of set bits
  // loads shard r^1; ranks 1, 2, 6 loading shards 0, 4, 5 instead of their own.
  std::vector<Case> matching_moments;
  {
    Case parity{"ranks of odd parity load their neighbour's shard", {64}, {}};
    Case three{"ranks 1, 2, 6 load shards 0, 4, 5", {64}, {}};
    for (int r = 0; r < 8; ++r) {
      parity.parts.push_back(FlatShardLayout({64}, 8, __builtin_popcount(r) % 2 == 1 ? r ^ 1 : r));
      three.parts.push_back(FlatShardLayout({64}, 8, r == 1 ? 0 : r == 2 ? 4 : r == 6 ? 5 : r));
    }
    matching_moments = {parity, three};
  }
  // A 2x2x2 grid of blocks of a 3-D tensor with the blocks of even parity doubled and the others
  // missing.
  Case grid{"a 2x2x2 block grid, even blocks twice", {4, 6, 2}, {}};
  for (int b = 0; b < 8; ++b) {
    const int i = b >> 2, j = (b >> 1) & 1, k = b & 1;
    if ((i + j + k) % 2 == 0) {
      for (int twice = 0; twice < 2; ++twice) grid.parts.push_back(Layout::Box({2 * i, 3 * j, k}, {2, 3, 1}));
    }
  }
  matching_moments.push_back(grid);
  for (Case& c : matching_moments) {
    int64_t count = 0;
    for (const Layout& part : c.parts) count += ValidateLayout(part, c.shape).value();
    ASSERT_EQ(count, NumElements(c.shape).value()) << c.what;  // as many elements as the tensor
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    uint64_t sum = 0;
    for (const Layout& part : c.parts) sum = AddIndexFingerprints(sum, IndexFingerprint(part, c.shape));
    EXPECT_NE(sum, IndexFingerprint(Layout::Whole(), c.shape)) << c.what;
  }
}

// A wrong rank index on real weight shapes: rank w loads shard s instead of its own, every
// other rank its own. Shards of a power-of-two number of elements differ from the whole by a
// multiple of a large power of two in the moments an earlier fingerprint summed mod 2^64 (or its
// low 40 bits), which lost it: a [2048, 1024] tensor split two ways passed as loaded whole.
TEST(IndexFingerprint, AWrongRankIndexIsSeenOnPowerOfTwoShapes) {
  const std::vector<Shape> shapes = {{2048, 1024}, {4096, 4096}, {1024, 2048}, {int64_t{1} << 33}, {32000, 4096},
                                     {4096, 11008}, {3 << 20}, {8, 1 << 20, 2}};
  int cases = 0;
  for (const Shape& shape : shapes) {
    const uint64_t whole = IndexFingerprint(Layout::Whole(), shape);
    for (int world : {2, 3, 4, 8}) {
      for (bool flat : {false, true}) {
        auto shard = [&](int i) { return flat ? FlatShardLayout(shape, world, i) : ChunkLayout(shape, 0, world, i); };
        for (int wrong = 0; wrong < world; ++wrong) {
          for (int source = 0; source < world; ++source) {
            if (source == wrong) continue;
            uint64_t sum = 0;
            for (int r = 0; r < world; ++r) sum = AddIndexFingerprints(sum, IndexFingerprint(shard(r == wrong ? source : r), shape));
            EXPECT_NE(sum, whole) << ShapeString(shape) << (flat ? " flat" : " dim0") << " in " << world << ": rank "
                                  << wrong << " loads shard " << source;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

// Fingerprints summed as doubles come back as their sum mod P: in one slot up to 4096 ranks, in
// two 20-bit halves past that (a job of 5,000 or 100,000 ranks, each near the largest value).
TEST(IndexFingerprint, SummedAsDoublesAtAnyWorldSize) {
  std::mt19937_64 rng(5);
  for (int ranks : {1, 2, 4096, 4097, 5000, 100000}) {
    const size_t slots = FingerprintSlots(ranks);
    EXPECT_EQ(slots, ranks > 4096 ? 2u : 1u);
    double summed[2] = {0, 0};
    uint64_t expected = 0;
    for (int r = 0; r < ranks; ++r) {
      const uint64_t f = r % 3 == 0 ? kP - 1 : rng() % kP;
      expected = AddIndexFingerprints(expected, f);
      double packed[2] = {0, 0};
      PackFingerprint(f, slots, packed);
      summed[0] += packed[0];
      summed[1] += packed[1];
    }
    EXPECT_EQ(UnpackFingerprintSum(summed, slots), expected) << ranks << " ranks";
  }
}

}  // namespace
}  // namespace shardckpt
