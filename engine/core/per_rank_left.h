// Per-rank values (a rank's RNG state, its data position) that a reshard could not carry: they
// belong to the ranks of the world that saved them and have no place at another world size.
//
// Why recorded: a load at the saved world size restores them, and one at another world size
// reports them unavailable. A checkpoint resharded to that other size held no trace of them, so
// the same resume code (a state dict holding PerRank values) failed a strict load with "not in
// checkpoint: 'rng'" (a user trial, 2026-12-07). Reshard now records their names, and a load
// reports them unavailable as it does at another world size.
#pragma once

#include <map>
#include <string>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {

// The manifest's creation metadata key: a JSON object {value name: the world size that saved it}.
inline constexpr const char* kPerRankValuesLeftKey = "per_rank_values_left";

// The record of `manifest` (empty without one, or where it is not such an object).
std::map<std::string, int> PerRankValuesLeft(const Manifest& manifest);
std::string EncodePerRankValuesLeft(const std::map<std::string, int>& left);

// Why a load does not restore a value the record holds.
std::string PerRankValueLeftReason(int saved_by);

}  // namespace shardckpt
