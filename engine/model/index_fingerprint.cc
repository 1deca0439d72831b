#include "shardckpt/engine/model/index_fingerprint.h"

namespace shardckpt {
namespace {

constexpr uint64_t kP = kIndexFingerprintModulus;
constexpr uint64_t kOrder = kP - 1;  // of the multiplicative group: exponents are taken mod this
constexpr uint64_t kRoot = 13;       // the smallest primitive root of P (P - 1 = 2^3 3^2 1487 10269667)

// a b mod P for a, b < P, without a 128-bit division (a library call): the product is under
// 2^80, and 2^40 = 87 (mod P) folds its high part down.
uint64_t Mul(uint64_t a, uint64_t b) {
  constexpr uint64_t kLow = (uint64_t{1} << 40) - 1, kFold = (uint64_t{1} << 40) - kP;  // 87
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  uint64_t x = static_cast<uint64_t>(product >> 40) * kFold + (static_cast<uint64_t>(product) & kLow);  // < 2^48
  x = (x >> 40) * kFold + (x & kLow);  // < 2^40 + 2^16
  return x >= kP ? x - kP : x;
}
uint64_t Add(uint64_t a, uint64_t b) { return AddIndexFingerprints(a, b); }
uint64_t Sub(uint64_t a, uint64_t b) { return AddIndexFingerprints(a, b == 0 ? 0 : kP - b); }

uint64_t Pow(uint64_t base, uint64_t e) {
  uint64_t result = 1;
  for (; e > 0; e >>= 1, base = Mul(base, base)) {
    if (e & 1) result = Mul(result, base);
  }
  return result;
}

// g^e by five tables of 256 powers (e mod P - 1 has 40 bits): four products instead of forty
// squarings, for the two powers each piece of a tensor costs.
class RootPowers {
 public:
  RootPowers() {
    uint64_t step = kRoot;  // g^(2^(8j))
    for (auto& table : tables_) {
      table[0] = 1;
      for (size_t v = 1; v < 256; ++v) table[v] = Mul(table[v - 1], step);
      step = Mul(table[255], step);
    }
  }
  uint64_t operator()(uint64_t e) const {
    e %= kOrder;
    uint64_t result = tables_[0][e & 255];
    for (size_t j = 1; j < 5; ++j) result = Mul(result, tables_[j][(e >> (8 * j)) & 255]);
    return result;
  }

 private:
  uint64_t tables_[5][256];
};

const RootPowers& RootPow() {
  static const RootPowers powers;
  return powers;
}

// sum of g^l for l in [begin, end): (g^end - g^begin) / (g - 1).
uint64_t RangeSum(uint64_t begin, uint64_t end) {
  static const uint64_t inverse = Pow(kRoot - 1, kP - 2);  // of g - 1, by Fermat
  const RootPowers& pow = RootPow();
  return Mul(Sub(pow(end), pow(begin)), inverse);
}

// sum of r^x for x in [0, n), by doubling: no division, so r may be 1.
uint64_t GeometricSum(uint64_t r, uint64_t n) {
  uint64_t sum = 0, power = 1;  // sum of r^x below m, and r^m, for m the bits of n read so far
  for (int bit = n == 0 ? -1 : 63 - __builtin_clzll(n); bit >= 0; --bit) {
    sum = Mul(sum, Add(1, power));  // m -> 2m
    power = Mul(power, power);
    if ((n >> bit) & 1) {  // m -> m + 1
      sum = Add(sum, power);
      power = Mul(power, r);
    }
  }
  return sum;
}

// A box whose dim k runs offsets[k] + [0, sizes[k]) with row-major stride strides[k]: with
// l = sum_k x_k s_k, the sum of g^l is the product over dims of sum_x (g^(s_k))^x.
uint64_t BoxSum(const int64_t* offsets, const int64_t* sizes, const uint64_t* strides, size_t dims) {
  const RootPowers& pow = RootPow();
  uint64_t product = 1;
  for (size_t k = 0; k < dims; ++k) {
    const uint64_t o = static_cast<uint64_t>(offsets[k]), n = static_cast<uint64_t>(sizes[k]);
    if (n == 0) return 0;
    const uint64_t stride = strides[k] % kOrder;
    const uint64_t first = pow(static_cast<uint64_t>(static_cast<unsigned __int128>(stride) * (o % kOrder) % kOrder));
    product = Mul(product, Mul(first, GeometricSum(pow(stride), n)));
  }
  return product;
}

}  // namespace

uint64_t IndexFingerprint(const Layout& layout, const Shape& global) {
  switch (layout.kind) {
    case LayoutKind::kWhole: {
      uint64_t numel = 1;
      for (int64_t d : global) numel *= static_cast<uint64_t>(d);
      return RangeSum(0, numel);
    }
    case LayoutKind::kFlatRange:
      if (layout.end <= layout.begin) return 0;
      return RangeSum(static_cast<uint64_t>(layout.begin), static_cast<uint64_t>(layout.end));
    case LayoutKind::kBox: {
      // Most boxes are one run of the row-major tensor (cut along dim 0 alone): a range's two
      // powers, where another box pays a geometric sum per dim.
      if (const int64_t start = ContiguousStart(layout, global); start >= 0) {
        uint64_t count = 1;
        for (int64_t n : layout.sizes) count *= static_cast<uint64_t>(n);
        return count == 0 ? 0 : RangeSum(static_cast<uint64_t>(start), static_cast<uint64_t>(start) + count);
      }
      const size_t dims = std::min<size_t>(global.size(), kMaxDims);  // validated layouts have at most kMaxDims
      uint64_t strides[kMaxDims];
      for (size_t d = 0; d < dims; ++d) strides[d] = 1;
      for (size_t d = dims; d-- > 1;) strides[d - 1] = strides[d] * static_cast<uint64_t>(global[d]);
      return BoxSum(layout.offsets.data(), layout.sizes.data(), strides, dims);
    }
  }
  return 0;
}

}  // namespace shardckpt
