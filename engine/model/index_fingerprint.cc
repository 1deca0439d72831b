#include "shardckpt/engine/model/index_fingerprint.h"

namespace shardckpt {
namespace {

constexpr uint64_t kP = kIndexFingerprintModulus;
// Any nonzero weight below P; the square sums' share of the fingerprint.
constexpr uint64_t kSquareWeight = 0x9E3779B97Full % kP;

uint64_t Mod(uint64_t x) { return x % kP; }
// a b mod P for a, b < P, without a 128-bit division (a library call: most of this check's cost
// at 20,000 pieces): the product is under 2^80, and 2^40 = 87 (mod P) folds its high part down.
uint64_t Mul(uint64_t a, uint64_t b) {
  constexpr uint64_t kLow = (uint64_t{1} << 40) - 1, kFold = (uint64_t{1} << 40) - kP;  // 87
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  uint64_t x = static_cast<uint64_t>(product >> 40) * kFold + (static_cast<uint64_t>(product) & kLow);  // < 2^48
  x = (x >> 40) * kFold + (x & kLow);  // < 2^40 + 2^16
  return x >= kP ? x - kP : x;
}
// For a, b < P.
uint64_t Add(uint64_t a, uint64_t b) { return AddIndexFingerprints(a, b); }
uint64_t Sub(uint64_t a, uint64_t b) { return AddIndexFingerprints(a, b == 0 ? 0 : kP - b); }

// Sum of x for x in [0, n), mod P: n(n-1)/2 with the even factor halved first (exact, as n is
// at most 2^50).
uint64_t SumBelow(uint64_t n) {
  if (n == 0) return 0;
  uint64_t a = n, b = n - 1;
  (a % 2 == 0 ? a : b) /= 2;
  return Mul(Mod(a), Mod(b));
}

// Sum of x^2 for x in [0, n), mod P: (n-1) n (2n-1) / 6, the 2 and the 3 divided out of the
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
  return Mul(Mul(Mod(f[0]), Mod(f[1])), Mod(f[2]));
}

// The count, index sum and square sum of a set of row-major indices, each mod P.
struct Moments {
  uint64_t count = 0, sum = 0, square_sum = 0;
};

Moments RangeMoments(uint64_t begin, uint64_t end) {
  return Moments{Mod(end - begin), Sub(SumBelow(end), SumBelow(begin)), Sub(SquareSumBelow(end), SquareSumBelow(begin))};
}

// A box whose dim k runs offsets[k] + [0, sizes[k]) with stride strides[k].
Moments BoxMoments(const int64_t* offsets, const int64_t* sizes, const uint64_t* strides, size_t dims) {
  Moments along[kMaxDims];  // each dim's own range of x_k
  for (size_t k = 0; k < dims; ++k) {
    const uint64_t o = static_cast<uint64_t>(offsets[k]), n = static_cast<uint64_t>(sizes[k]);
    if (n == 0) return Moments{};
    along[k] = RangeMoments(o, o + n);
  }
  // With l = sum_k x_k s_k over the box, and P(k...) the product of the sizes of the other dims:
  //   sum l   = sum_k s_k A_k P(k)
  //   sum l^2 = sum_k s_k^2 B_k P(k) + 2 sum_{k<j} s_k s_j A_k A_j P(k, j)
  // where A_k, B_k are dim k's sum and square sum.
  auto others = [&](size_t skip1, size_t skip2) {
    uint64_t p = 1;
    for (size_t d = 0; d < dims; ++d) {
      if (d != skip1 && d != skip2) p = Mul(p, along[d].count);
    }
    return p;
  };
  Moments m;
  m.count = others(dims, dims);
  for (size_t k = 0; k < dims; ++k) {
    const uint64_t rest = others(k, k), stride = Mod(strides[k]);
    m.sum = Add(m.sum, Mul(Mul(stride, along[k].sum), rest));
    m.square_sum = Add(m.square_sum, Mul(Mul(Mul(stride, stride), along[k].square_sum), rest));
    for (size_t j = k + 1; j < dims; ++j) {
      const uint64_t strides_kj = Mul(stride, Mod(strides[j]));
      const uint64_t cross = Mul(Mul(Add(strides_kj, strides_kj), Mul(along[k].sum, along[j].sum)), others(k, j));
      m.square_sum = Add(m.square_sum, cross);
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
      // Most boxes are one run of the row-major tensor (cut along dim 0 alone): a range's sums are
      // a few products where a box's are a few per pair of dims.
      if (const int64_t start = ContiguousStart(layout, global); start >= 0) {
        uint64_t count = 1;
        for (int64_t n : layout.sizes) count *= static_cast<uint64_t>(n);
        m = RangeMoments(static_cast<uint64_t>(start), static_cast<uint64_t>(start) + count);
        break;
      }
      const size_t dims = std::min<size_t>(global.size(), kMaxDims);  // validated layouts have at most kMaxDims
      uint64_t strides[kMaxDims];
      for (size_t d = 0; d < dims; ++d) strides[d] = 1;
      for (size_t d = dims; d-- > 1;) strides[d - 1] = strides[d] * static_cast<uint64_t>(global[d]);
      m = BoxMoments(layout.offsets.data(), layout.sizes.data(), strides, dims);
      break;
    }
  }
  // Over l + 1, so that index 0 weighs as much as any: sum (l+1) = S1 + C and
  // sum (l+1)^2 = S2 + 2 S1 + C.
  const uint64_t shifted_sum = Add(m.sum, m.count);
  const uint64_t shifted_squares = Add(Add(m.square_sum, Add(m.sum, m.sum)), m.count);
  return Add(shifted_sum, Mul(kSquareWeight, shifted_squares));
}

}  // namespace shardckpt
