// The multi-rank test scenario: a fixed set of entries of every dtype and shape kind, laid out by
// a named layout family for any world size. Saving at N ranks with one family and loading at M
// with another is a reshard; every byte is checked against test_util's ExpectedByte.
#pragma once

#include <string>
#include <vector>

#include "shardckpt/engine/model/state.h"

namespace shardckpt::testing {

struct ScenarioEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t index = 0;  // position in ScenarioEntries(): picks the entry's layout in the mixed family
};

const std::vector<ScenarioEntry>& ScenarioEntries();
// Appends `count` tiny entries (biases, norms, step counters: 1 byte to a few KiB, 0-d to 2-d) to
// the scenario, before any use: the many-small-tensors case of packed chunks (format 1.1).
void AddManySmallEntries(int count);

// Families: replicated, flat, dim0, mixed (flat, dim0, column, 2-D grid and replicated across
// entries, plus one entry held as several row pieces per rank).
std::vector<Layout> ScenarioLayouts(const ScenarioEntry& entry, const std::string& family, int world, int rank);
bool IsKnownFamily(const std::string& family);

}  // namespace shardckpt::testing
