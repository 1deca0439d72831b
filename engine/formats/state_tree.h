// Rebuilds, for a .pt, the nesting that import flattened to dotted names: the lists and tuples it
// recorded (path -> "list" | "tuple") come back as lists and tuples, dicts inside them as dicts.
// Keys at the top stay dotted, as state_dict() names them ("layers.0.weight" is one key). Where a
// leaf's whole path is known (a DCP folder's planner_data), it is put exactly there instead.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardckpt/engine/formats/state_path.h"
#include "shardckpt/engine/formats/torch_pickle.h"

namespace shardckpt {

// The manifest's creation info key (user metadata) under which import records the lists and
// tuples of a .pt it flattened to "name.0", "name.1", ...: a JSON object {path: "list"|"tuple"}.
inline constexpr const char* kTorchContainersKey = "torch_containers";
// ... and under which it records where the plain values sat among the tensors (entries and blobs
// are kept apart): a JSON object {value name: name of the tensor entry that followed it}; values
// after the last tensor, and checkpoints without the key, go at the end.
inline constexpr const char* kTorchValueOrderKey = "torch_value_order";
// That record as value name -> the tensor entry that followed it; empty where it is not a JSON
// object (values whose follower is not a string are left out: they go at the end).
std::unordered_map<std::string, std::string> DecodeValueOrder(const std::string& json);
// The record from value name -> the tensor entry that followed it (import and the DCP reader).
std::string EncodeValueOrder(const std::unordered_map<std::string, std::string>& followers);

// The manifest's creation info key (user metadata) under which the paths of flattened keys are
// recorded, for consolidation to rebuild the nesting: by a DCP folder's reader (the nesting
// dcp_to_torch_save rebuilds), by import of a .pt and by the Python package's save (the state
// dict as saved). A JSON object {key: [step, ...]}, each step a string (a dict key), an integer (a
// list index), {"int": n} (a dict key that is an int) or {"tuple": i} (a tuple's index). Only keys
// whose path is more than the key itself are recorded.
inline constexpr const char* kTorchPathsKey = "torch_paths";
// Longer paths are left out (their key stays at the top): a hostile .metadata's million-step path
// would otherwise build a tree that deep. A .pt holds at most 128 levels (torch_pickle.h).
inline constexpr size_t kMaxStatePathSteps = 129;
// The steps joined by dots: what the path's flattened key must be.
std::string JoinedStatePath(const StatePath& path);
std::string EncodeStatePaths(const std::vector<std::pair<std::string, StatePath>>& paths);
// Paths that are not a JSON object of such lists, or whose steps do not join to their key, are
// left out (they only shape the output; a leaf without one keeps its key at the top).
std::unordered_map<std::string, StatePath> DecodeStatePaths(const std::string& json);

// A name of `names` that `paths` does not place though it may need to, or "" when there is none:
// a dotted name without a path, a dotted prefix of which is the first step of a recorded path,
// would land at the top beside the nested dict of that name ("optim.state.2.exp_avg" beside
// "optim"). Such a record is taken as incomplete (rank 0's, of a state whose other ranks name
// other leaves), though a top-level key with a dot ("optim.y" beside "optim") looks the same.
std::string FirstNameLeftUnplaced(const std::unordered_map<std::string, StatePath>& paths,
                                  const std::vector<std::string>& names);

class StateTreeBuilder {
 public:
  explicit StateTreeBuilder(std::map<std::string, std::string> containers,
                            std::unordered_map<std::string, StatePath> paths = {});
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
  Status AddAtPath(const std::string& name, const StatePath& path, PickleNode leaf);

  std::map<std::string, std::string> containers_;
  std::unordered_map<std::string, StatePath> paths_;
  std::unique_ptr<Tree> root_;
  // With no containers recorded (a plain state dict) every name is a key of the root: kept as
  // the root's items, in order, with a hash of each key for finding repeats. Building a node per
  // leaf cost a quarter of a 20,000-tensor consolidation.
  std::vector<std::pair<std::string, PickleNode>> root_items_;
  std::unordered_map<size_t, size_t> root_item_of_hash_;
};

}  // namespace shardckpt
