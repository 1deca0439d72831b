// A number that sums over the elements a layout holds, so that the ranks of a load can tell, in
// one reduction, whether their parts of a tensor cover it exactly.
//
// Why: a strict load refuses a tensor whose parts, over every rank, hold fewer elements than it.
// A count alone passes two ranks that both load shard 0 of a two-way split (the classic wrong
// rank index): 2 x half = the whole count, and half the tensor is never loaded. The fingerprint
// of a set of elements is the sum over its row-major indices l of h(l) = (l + 1) + K (l + 1)^2,
// mod 2^64, in closed form per box (no loop over elements). A set of exactly numel elements that
// covers the tensor sums to the whole tensor's fingerprint; one that counts numel with some
// elements twice and others missing almost never does (its index sums and square sums would both
// have to match). Sums of fingerprints wrap mod 2^64 like the indices they stand for.
#pragma once

#include <cstdint>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

// The fingerprint of the elements `layout` holds in the row-major `global` (a layout already
// validated against it; a whole layout is every element, an empty one 0).
uint64_t IndexFingerprint(const Layout& layout, const Shape& global);

}  // namespace shardckpt
