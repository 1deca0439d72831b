// Tied weights: two manifest entries that are one tensor under two names (lm_head.weight and
// embed.weight) point at the same chunks, so the bytes are stored once (import of a .pt whose
// state dict names one storage twice, reshard of such a checkpoint). Pure.
#pragma once

#include <cstdint>
#include <vector>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {

// Whether `e` and `f` are one tensor stored once: the same dtype, shape and list of chunks.
bool SameChunks(const EntryRecord& e, const EntryRecord& f);

// For each entry, the index of the first earlier entry it is an alias of (SameChunks, with a
// non-empty list of chunks), or -1.
std::vector<int64_t> EntryAliases(const Manifest& m);

}  // namespace shardckpt
