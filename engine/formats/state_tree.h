// Rebuilds, for a .pt, the nesting that import flattened to dotted names: the lists and tuples it
// recorded (path -> "list" | "tuple") come back as lists and tuples, dicts inside them as dicts.
// Keys at the top stay dotted, as state_dict() names them ("layers.0.weight" is one key).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardckpt/engine/formats/torch_pickle.h"

namespace shardckpt {

// The manifest's creation info key (user metadata) under which import records the lists and
// tuples of a .pt it flattened to "name.0", "name.1", ...: a JSON object {path: "list"|"tuple"}.
inline constexpr const char* kTorchContainersKey = "torch_containers";
// ... and under which it records where the plain values sat among the tensors (entries and blobs
// are kept apart): a JSON object {value name: name of the tensor entry that followed it}; values
// after the last tensor, and checkpoints without the key, go at the end.
inline constexpr const char* kTorchValueOrderKey = "torch_value_order";

class StateTreeBuilder {
 public:
  explicit StateTreeBuilder(std::map<std::string, std::string> containers);
  ~StateTreeBuilder();
  // Room for `leaves` leaves at the root (a plain state dict's tensors and values).
  void Reserve(size_t leaves);
  // Adds a leaf (a tensor or a value node) under its dotted name; errors name a clash.
  Status Add(const std::string& name, PickleNode leaf);
  // The root dict. A list whose items are not exactly 0..n-1 (some were not selected) becomes a
  // dict keyed by the indices that are there.
  PickleNode Finish();

 private:
  struct Tree;
  Status AddToRoot(const std::string& name, PickleNode leaf);

  std::map<std::string, std::string> containers_;
  std::unique_ptr<Tree> root_;
  // With no containers recorded (a plain state dict) every name is a key of the root: kept as
  // the root's items, in order, with a hash of each key for finding repeats. Building a node per
  // leaf cost a quarter of a 20,000-tensor consolidation.
  std::vector<std::pair<std::string, PickleNode>> root_items_;
  std::unordered_map<size_t, size_t> root_item_of_hash_;
};

}  // namespace shardckpt
