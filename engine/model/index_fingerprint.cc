#include "shardckpt/engine/model/index_fingerprint.h"

#include <vector>

namespace shardckpt {
namespace {

// Odd, so that K * (square sum) keeps every bit of the square sum's difference.
constexpr uint64_t kSquareWeight = 0x9E3779B97F4A7C15ull;

// Sum of x for x in [0, n), mod 2^64: n(n-1)/2 with the even factor halved first, so the
// division is exact before anything wraps.
uint64_t SumBelow(uint64_t n) {
  if (n == 0) return 0;
  uint64_t a = n, b = n - 1;
  (a % 2 == 0 ? a : b) /= 2;
  return a * b;
}

// Sum of x^2 for x in [0, n), mod 2^64: (n-1) n (2n-1) / 6, the 2 and the 3 divided out of the
// factors that hold them (one of n-1, n is even; one of n-1, n, 2n-1 is a multiple of 3).
uint64_t SquareSumBelow(uint64_t n) {
  if (n == 0) return 0;
  uint64_t f[3] = {n - 1, n, 2 * n - 1};
  (f[0] % 2 == 0 ? f[0] : f[1]) /= 2;
  for (uint64_t& x : f) {
    if (x % 3 == 0) {
      x /= 3;
      break;
    }
  }
  return f[0] * f[1] * f[2];
}

// The count, index sum and square sum of one box of the row-major index space: dim k runs
// offsets[k] + [0, sizes[k]) with stride strides[k].
struct Moments {
  uint64_t count = 0, sum = 0, square_sum = 0;
};

Moments RangeMoments(uint64_t begin, uint64_t end) {
  return Moments{end - begin, SumBelow(end) - SumBelow(begin), SquareSumBelow(end) - SquareSumBelow(begin)};
}

Moments BoxMoments(const int64_t* offsets, const int64_t* sizes, const std::vector<uint64_t>& strides) {
  const size_t dims = strides.size();
  std::vector<Moments> along(dims);  // each dim's own range of x_k
  uint64_t count = 1;
  for (size_t k = 0; k < dims; ++k) {
    const uint64_t o = static_cast<uint64_t>(offsets[k]), n = static_cast<uint64_t>(sizes[k]);
    if (n == 0) return Moments{};
    along[k] = RangeMoments(o, o + n);
    count *= n;
  }
  // With l = sum_k x_k s_k over the box, and P(k...) the product of the sizes of the other dims:
  //   sum l   = sum_k s_k A_k P(k)
  //   sum l^2 = sum_k s_k^2 B_k P(k) + 2 sum_{k<j} s_k s_j A_k A_j P(k, j)
  // where A_k, B_k are dim k's sum and square sum.
  auto others = [&](size_t skip1, size_t skip2) {
    uint64_t p = 1;
    for (size_t d = 0; d < dims; ++d) {
      if (d != skip1 && d != skip2) p *= along[d].count;
    }
    return p;
  };
  Moments m;
  m.count = count;
  for (size_t k = 0; k < dims; ++k) {
    const uint64_t rest = others(k, k);
    m.sum += strides[k] * along[k].sum * rest;
    m.square_sum += strides[k] * strides[k] * along[k].square_sum * rest;
    for (size_t j = k + 1; j < dims; ++j) {
      m.square_sum += 2 * strides[k] * strides[j] * along[k].sum * along[j].sum * others(k, j);
    }
  }
  return m;
}

}  // namespace

uint64_t IndexFingerprint(const Layout& layout, const Shape& global) {
  Moments m;
  switch (layout.kind) {
    case LayoutKind::kWhole: {
      uint64_t numel = 1;
      for (int64_t d : global) numel *= static_cast<uint64_t>(d);
      m = RangeMoments(0, numel);
      break;
    }
    case LayoutKind::kFlatRange:
      if (layout.end > layout.begin) m = RangeMoments(static_cast<uint64_t>(layout.begin), static_cast<uint64_t>(layout.end));
      break;
    case LayoutKind::kBox: {
      std::vector<uint64_t> strides(global.size(), 1);
      for (size_t d = global.size(); d-- > 1;) strides[d - 1] = strides[d] * static_cast<uint64_t>(global[d]);
      m = BoxMoments(layout.offsets.data(), layout.sizes.data(), strides);
      break;
    }
  }
  // Over l + 1, so that index 0 weighs as much as any: sum (l+1) = S1 + C and
  // sum (l+1)^2 = S2 + 2 S1 + C.
  const uint64_t shifted_sum = m.sum + m.count;
  const uint64_t shifted_squares = m.square_sum + 2 * m.sum + m.count;
  return shifted_sum + kSquareWeight * shifted_squares;
}

}  // namespace shardckpt
