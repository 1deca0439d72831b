#include "shardckpt/engine/formats/state_tree.h"

#include <climits>
#include <string_view>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace shardckpt {

namespace {

Status TwoValuesNamed(const std::string& name) {
  return InvalidArgument("'" + name + "' names two values (an entry and a blob?)");
}

}  // namespace

struct StateTreeBuilder::Tree {
  PickleNode::Kind kind = PickleNode::kDict;
  PickleNode leaf;  // when is_leaf
  bool is_leaf = false;
  bool int_key = false;  // its key in the dict holding it is an int
  std::vector<std::string> keys;  // in insertion order
  // Hashed: `keys` gives the order, and a state dict's root holds up to hundreds of thousands.
  std::unordered_map<std::string, std::unique_ptr<Tree>> children;

  Result<Tree*> Child(const std::string& key, PickleNode::Kind child_kind, const std::string& path, bool int_key = false) {
    auto it = children.find(key);
    if (it == children.end()) {
      keys.push_back(key);
      it = children.emplace(key, std::make_unique<Tree>()).first;
      it->second->kind = child_kind;
      it->second->int_key = int_key;
    } else if (it->second->is_leaf) {
      return InvalidArgument("'" + path + "' is both a value and a container of others");
    }
    return it->second.get();
  }

  // `value` as this level's item `key`; `name` (the flattened name) for the errors.
  Status Put(const std::string& key, PickleNode value, const std::string& name, bool int_key = false) {
    auto taken = children.find(key);
    if (taken != children.end()) {
      return taken->second->is_leaf ? TwoValuesNamed(name)
                                    : InvalidArgument("'" + name + "' is both a value and a container of others");
    }
    keys.push_back(key);
    auto& slot = children[key];
    slot = std::make_unique<Tree>();
    slot->is_leaf = true;
    slot->int_key = int_key;
    slot->leaf = std::move(value);
    return Status::Ok();
  }

  PickleNode Take() {
    if (is_leaf) {
      leaf.int_key = int_key;
      return std::move(leaf);
    }
    PickleNode node;
    node.kind = kind;
    node.int_key = int_key;
    if (kind != PickleNode::kDict) {  // items exactly 0..n-1, else a dict of those there are
      bool dense = true;
      for (size_t i = 0; i < keys.size() && dense; ++i) dense = children.count(std::to_string(i)) == 1;
      if (dense) {
        for (size_t i = 0; i < keys.size(); ++i) node.items.emplace_back("", children[std::to_string(i)]->Take());
        return node;
      }
      node.kind = PickleNode::kDict;
    }
    for (const std::string& key : keys) node.items.emplace_back(key, children[key]->Take());
    return node;
  }
};

std::unordered_map<std::string, std::string> DecodeValueOrder(const std::string& json) {
  std::unordered_map<std::string, std::string> out;
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  if (!parsed.is_object()) return out;
  for (const auto& [value, next] : parsed.items()) {
    if (next.is_string()) out.emplace(value, next.get<std::string>());
  }
  return out;
}

std::string EncodeValueOrder(const std::unordered_map<std::string, std::string>& followers) {
  // A lookup table: no order to keep (an ordered_json's inserts search its whole list).
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [value, next] : followers) out[value] = next;
  return out.dump();
}

std::string JoinedStatePath(const StatePath& path) {
  std::string out;
  for (const StatePathStep& step : path) out += (out.empty() ? "" : ".") + step.key;
  return out;
}

std::string EncodeStatePaths(const std::vector<std::pair<std::string, StatePath>>& paths) {
  // A lookup table: no order to keep (an ordered_json's inserts search its whole list).
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, path] : paths) {
    nlohmann::json steps = nlohmann::json::array();
    for (const StatePathStep& step : path) {
      if (step.is_index && step.in_tuple) steps.push_back({{"tuple", std::stoll(step.key)}});
      else if (step.is_index) steps.push_back(std::stoll(step.key));
      else if (step.int_key) steps.push_back({{"int", std::stoll(step.key)}});
      else steps.push_back(step.key);
    }
    out[name] = std::move(steps);
  }
  return out.dump();
}

std::unordered_map<std::string, StatePath> DecodeStatePaths(const std::string& json) {
  std::unordered_map<std::string, StatePath> out;
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  if (!parsed.is_object()) return out;
  for (const auto& [name, steps] : parsed.items()) {
    if (!steps.is_array() || steps.empty() || steps.size() > kMaxStatePathSteps) continue;
    StatePath path;
    bool valid = true;
    for (const auto& step : steps) {
      // {"int": n}, {"tuple": i}: one member, an integer (an index is not negative).
      const nlohmann::json* tagged = nullptr;
      const bool int_key = step.is_object() && step.size() == 1 && step.contains("int");
      const bool tuple_index = step.is_object() && step.size() == 1 && step.contains("tuple");
      if (int_key || tuple_index) tagged = &step.begin().value();
      if (step.is_string()) {
        path.push_back({step.get<std::string>()});
      } else if (step.is_number_integer() && step.get<int64_t>() >= 0) {
        path.push_back({std::to_string(step.get<int64_t>()), true});
      } else if (tagged != nullptr && tagged->is_number_integer() &&
                 !(tagged->is_number_unsigned() && tagged->get<uint64_t>() > INT64_MAX) &&
                 (int_key || tagged->get<int64_t>() >= 0)) {
        path.push_back({std::to_string(tagged->get<int64_t>()), tuple_index, int_key, tuple_index});
      } else {
        valid = false;
        break;
      }
    }
    if (valid && JoinedStatePath(path) == name) out.emplace(name, std::move(path));
  }
  return out;
}

std::string FirstNameLeftUnplaced(const std::unordered_map<std::string, StatePath>& paths,
                                  const std::vector<std::string>& names) {
  std::unordered_set<std::string> heads;
  for (const auto& [name, path] : paths) {
    if (!path.empty() && !path[0].is_index) heads.insert(path[0].key);
  }
  for (const std::string& name : names) {
    if (paths.count(name)) continue;
    // Every dotted prefix: a nested dict's own name may hold dots ("opt.a").
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      if (heads.count(name.substr(0, dot))) return name;
    }
  }
  return "";
}

StateTreeBuilder::StateTreeBuilder(std::map<std::string, std::string> containers,
                                   std::unordered_map<std::string, StatePath> paths)
    : containers_(std::move(containers)), paths_(std::move(paths)), root_(std::make_unique<Tree>()) {}
StateTreeBuilder::~StateTreeBuilder() = default;

void StateTreeBuilder::Reserve(size_t leaves) {
  if (!containers_.empty() || !paths_.empty()) return;
  root_items_.reserve(leaves);
  root_item_of_hash_.reserve(leaves);
}

Status StateTreeBuilder::AddToRoot(const std::string& name, PickleNode leaf) {
  const size_t hash = std::hash<std::string_view>()(name);
  auto [it, fresh] = root_item_of_hash_.try_emplace(hash, root_items_.size());
  if (!fresh) {
    if (root_items_[it->second].first == name) return TwoValuesNamed(name);
    // Another name of the same hash (rare): only a walk over every key can tell.
    for (const auto& item : root_items_) {
      if (item.first == name) return TwoValuesNamed(name);
    }
  }
  root_items_.emplace_back(name, std::move(leaf));
  return Status::Ok();
}

Status StateTreeBuilder::AddAtPath(const std::string& name, const StatePath& path, PickleNode leaf) {
  Tree* node = root_.get();
  std::string walked;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    walked += (i ? "." : "") + path[i].key;
    // A level holding indices is a list or tuple (items exactly 0..n-1 at the end, else a dict
    // of them).
    const StatePathStep& next = path[i + 1];
    const PickleNode::Kind kind = !next.is_index ? PickleNode::kDict : next.in_tuple ? PickleNode::kTuple : PickleNode::kList;
    SC_ASSIGN_OR_RETURN(node, node->Child(path[i].key, kind, walked, path[i].int_key));
  }
  return node->Put(path.back().key, std::move(leaf), name, path.back().int_key);
}

Status StateTreeBuilder::Add(const std::string& name, PickleNode leaf) {
  if (!paths_.empty()) {
    auto path = paths_.find(name);
    return path != paths_.end() ? AddAtPath(name, path->second, std::move(leaf))
                                : AddAtPath(name, {StatePathStep{name, false}}, std::move(leaf));
  }
  if (containers_.empty()) return AddToRoot(name, std::move(leaf));
  auto kind_of = [&](const std::string& path) {
    auto it = containers_.find(path);
    if (it == containers_.end()) return PickleNode::kDict;
    return it->second == "tuple" ? PickleNode::kTuple : PickleNode::kList;
  };
  // At the top, the shortest dotted prefix that is a recorded container is the key.
  Tree* node = root_.get();
  std::string path, rest = name;
  // (Skipped when none is recorded: one substring and lookup per dot of every name otherwise.)
  for (size_t dot = containers_.empty() ? std::string::npos : name.find('.'); dot != std::string::npos;
       dot = name.find('.', dot + 1)) {
    if (containers_.count(name.substr(0, dot))) {
      path = name.substr(0, dot);
      rest = name.substr(dot + 1);
      SC_ASSIGN_OR_RETURN(node, root_->Child(path, kind_of(path), path));
      break;
    }
  }
  // Below it, every component is a level.
  while (!path.empty()) {
    const size_t dot = rest.find('.');
    if (dot == std::string::npos) break;
    const std::string key = rest.substr(0, dot);
    path += "." + key;
    rest = rest.substr(dot + 1);
    SC_ASSIGN_OR_RETURN(node, node->Child(key, kind_of(path), path));
  }
  return node->Put(rest, std::move(leaf), name);
}

PickleNode StateTreeBuilder::Finish() {
  if (!containers_.empty() || !paths_.empty()) return root_->Take();
  PickleNode root;
  root.kind = PickleNode::kDict;
  root.items = std::move(root_items_);
  return root;
}

}  // namespace shardckpt
