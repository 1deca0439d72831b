#include "shardckpt/engine/model/shared_targets.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

namespace shardckpt {
namespace {

std::string Described(const TensorPiece& p) {
  return "'" + p.name + "' (" + std::to_string(p.bytes) + " bytes at " + std::to_string(reinterpret_cast<uintptr_t>(p.data)) +
         ")";
}

}  // namespace

SharedTargets FindSharedTargets(const std::vector<TensorPiece>& pieces, const std::vector<size_t>* among) {
  SharedTargets shared;
  // By memory space, device and start, then by index: pieces over the same bytes end up side by
  // side, earliest first. A piece that overlaps any earlier one overlaps the one reaching farthest
  // so far in its space (it starts before that one's end), and is paired with it; the earlier one
  // was paired when it came, unless it is that farthest one.
  // The keys copied out first: a sort whose comparisons read the pieces missed cache on each
  // (1.2 ms of a 40 ms load of 20,000 small tensors).
  struct Key {
    uint64_t space_device;
    uintptr_t start, end;
    size_t index;
    bool operator<(const Key& o) const { return std::tie(space_device, start, index) < std::tie(o.space_device, o.start, o.index); }
  };
  std::vector<Key> order;
  auto add = [&](size_t i) {
    const TensorPiece& p = pieces[i];
    if (p.bytes <= 0) return;
    const uint64_t space_device = (static_cast<uint64_t>(p.space) << 32) | static_cast<uint32_t>(p.device);
    const uintptr_t start = reinterpret_cast<uintptr_t>(p.data);
    order.push_back(Key{space_device, start, start + static_cast<uintptr_t>(p.bytes), i});
  };
  if (among != nullptr) {
    order.reserve(among->size());
    for (size_t i : *among) add(i);
  } else {
    order.reserve(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) add(i);
  }
  std::sort(order.begin(), order.end());
  const Key* reach = nullptr;  // the piece reaching farthest so far in this space (the earliest of equals)
  for (const Key& k : order) {
    const bool same_space = reach != nullptr && reach->space_device == k.space_device;
    if (same_space && k.start < reach->end) {
      if (k.start == reach->start && k.end == reach->end) {
        shared.same.emplace_back(k.index, reach->index);
        continue;
      }
      shared.overlapping.emplace_back(k.index, reach->index);
    }
    if (!same_space || k.end > reach->end) reach = &k;
  }
  return shared;
}

Status OverlapRefusal(const std::vector<TensorPiece>& pieces, const std::pair<size_t, size_t>& overlapping) {
  const TensorPiece &a = pieces[std::min(overlapping.first, overlapping.second)],
                    &b = pieces[std::max(overlapping.first, overlapping.second)];
  return InvalidArgument(
      (a.name == b.name ? "two pieces of tensor '" + a.name + "'" : "tensors '" + a.name + "' and '" + b.name + "'") +
      " of the state passed overlap in memory without being the same bytes (" + Described(a) + " and " + Described(b) +
      "): a load would write one over part of the other; load into tensors of their own");
}

}  // namespace shardckpt
