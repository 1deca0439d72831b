// A number that sums over the elements a layout holds, so that the ranks of a load can tell, in
// one reduction, whether their parts of a tensor cover it exactly.
//
// Why: a strict load refuses a tensor whose parts, over every rank, hold fewer elements than it.
// A count alone passes two ranks that both load shard 0 of a two-way split (the classic wrong
// rank index): 2 x half = the whole count, and half the tensor is never loaded. The fingerprint
// of a set of elements is the sum over its row-major indices l of g^l mod P, P a prime just under
// 2^40 and g a primitive root of it, in closed form per box (geometric sums, no loop over
// elements). A set that covers the tensor exactly sums to the whole tensor's fingerprint. One of
// as many elements that holds some twice (D) and others never (M) matches it only where g is a
// root of the polynomial sum_D x^l - sum_M x^l, which no layout chooses: by chance, about one
// time in 2^40 per tensor. Moments (sums of l and l^2, an earlier version) were blind to whole
// families of patterns, and a modulus of 2^64 to shards of a power-of-two size. Indices are told
// apart mod P - 1 (about 1.1e12) only: past that many elements a tensor's fingerprint says nothing,
// and the load does not compare it (kIndexFingerprintMaxElements).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

// 2^40 - 87, prime. Below 2^40, so that a world of 2^12 ranks' fingerprints sum exactly in a double.
inline constexpr uint64_t kIndexFingerprintModulus = (uint64_t{1} << 40) - 87;

// The fingerprint of the elements `layout` holds in the row-major `global` (a layout already
// validated against it; a whole layout is every element, an empty one 0), in [0, modulus).
uint64_t IndexFingerprint(const Layout& layout, const Shape& global);

// Tensors of more elements than this have indices that alias mod P - 1.
inline constexpr int64_t kIndexFingerprintMaxElements = static_cast<int64_t>(kIndexFingerprintModulus - 1);

// The fingerprint of a set taken `times` times over (replicas): its product with `times` mod P.
inline uint64_t ScaleIndexFingerprint(uint64_t fingerprint, uint64_t times) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(fingerprint) * (times % kIndexFingerprintModulus) %
                               kIndexFingerprintModulus);
}

// A fingerprint as doubles for a sum over `ranks` ranks (a reduction of doubles, exact below
// 2^53): one value up to 4096 ranks (4096 x 2^40 = 2^52), two 20-bit halves past that, exact up to
// 2^32 ranks. FingerprintSlots says how many; PackFingerprint writes them, and UnpackFingerprintSum
// reads the summed slots back as the sum of the fingerprints mod the modulus.
inline size_t FingerprintSlots(int ranks) { return ranks > 4096 ? 2 : 1; }
inline void PackFingerprint(uint64_t fingerprint, size_t slots, double* out) {
  if (slots == 1) {
    out[0] = static_cast<double>(fingerprint);
  } else {
    out[0] = static_cast<double>(fingerprint >> 20);
    out[1] = static_cast<double>(fingerprint & ((uint64_t{1} << 20) - 1));
  }
}
inline uint64_t UnpackFingerprintSum(const double* in, size_t slots) {
  const uint64_t first = static_cast<uint64_t>(in[0]) % kIndexFingerprintModulus;
  if (slots == 1) return first;
  const uint64_t high = (first << 20) % kIndexFingerprintModulus;  // first < 2^40: no overflow
  const uint64_t low = static_cast<uint64_t>(in[1]) % kIndexFingerprintModulus;
  const uint64_t sum = high + low;
  return sum >= kIndexFingerprintModulus ? sum - kIndexFingerprintModulus : sum;
}

// The fingerprint of two disjoint sets' union: their sum mod the modulus.
inline uint64_t AddIndexFingerprints(uint64_t a, uint64_t b) {
  const uint64_t sum = a + b;
  return sum >= kIndexFingerprintModulus ? sum - kIndexFingerprintModulus : sum;
}

}  // namespace shardckpt
