#include "shardckpt/engine/formats/state_tree.h"

#include <string_view>

namespace shardckpt {

struct StateTreeBuilder::Tree {
  PickleNode::Kind kind = PickleNode::kDict;
  PickleNode leaf;  // when is_leaf
  bool is_leaf = false;
  std::vector<std::string> keys;  // in insertion order
  // Hashed: `keys` gives the order, and a state dict's root holds up to hundreds of thousands.
  std::unordered_map<std::string, std::unique_ptr<Tree>> children;

  Result<Tree*> Child(const std::string& key, PickleNode::Kind child_kind, const std::string& path) {
    auto it = children.find(key);
    if (it == children.end()) {
      keys.push_back(key);
      it = children.emplace(key, std::make_unique<Tree>()).first;
      it->second->kind = child_kind;
    } else if (it->second->is_leaf) {
      return InvalidArgument("'" + path + "' is both a value and a container of others");
    }
    return it->second.get();
  }

  PickleNode Take() {
    if (is_leaf) return std::move(leaf);
    PickleNode node;
    node.kind = kind;
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

StateTreeBuilder::StateTreeBuilder(std::map<std::string, std::string> containers)
    : containers_(std::move(containers)), root_(std::make_unique<Tree>()) {}
StateTreeBuilder::~StateTreeBuilder() = default;

namespace {

Status TwoValuesNamed(const std::string& name) {
  return InvalidArgument("'" + name + "' names two values (an entry and a blob?)");
}

}  // namespace

void StateTreeBuilder::Reserve(size_t leaves) {
  if (!containers_.empty()) return;
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

Status StateTreeBuilder::Add(const std::string& name, PickleNode leaf) {
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
  auto taken = node->children.find(rest);
  if (taken != node->children.end()) {
    return taken->second->is_leaf ? TwoValuesNamed(name)
                                  : InvalidArgument("'" + name + "' is both a value and a container of others");
  }
  node->keys.push_back(rest);
  auto& slot = node->children[rest];
  slot = std::make_unique<Tree>();
  slot->is_leaf = true;
  slot->leaf = std::move(leaf);
  return Status::Ok();
}

PickleNode StateTreeBuilder::Finish() {
  if (!containers_.empty()) return root_->Take();
  PickleNode root;
  root.kind = PickleNode::kDict;
  root.items = std::move(root_items_);
  return root;
}

}  // namespace shardckpt
