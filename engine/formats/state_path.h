// Where a leaf sat in a nested state dict, one step per level: what consolidation to .pt needs to
// put a flattened name ("optim.state.0.exp_avg") back where it came from.
#pragma once

#include <string>
#include <vector>

namespace shardckpt {

// One level: a dict key (a string, or an int such as an optimizer's parameter number) or a list's
// or tuple's index. DCP records such steps per flattened key (its planner_data, torch's
// OBJ_PATH): "optim.param_groups.0.lr" is ("optim", "param_groups", 0, "lr"),
// "model.layers.0.weight" is ("model", "layers.0.weight").
struct StatePathStep {
  std::string key;        // the dict key, or the index, in decimal
  bool is_index = false;  // a list's index (a tuple's, with in_tuple)
  bool int_key = false;   // a dict key that is an int, not a string
  bool in_tuple = false;  // with is_index: the container is a tuple
  bool operator==(const StatePathStep& other) const {
    return key == other.key && is_index == other.is_index && int_key == other.int_key && in_tuple == other.in_tuple;
  }
};
using StatePath = std::vector<StatePathStep>;

}  // namespace shardckpt
