#include "shardckpt/engine/core/per_rank_left.h"

#include <nlohmann/json.hpp>

namespace shardckpt {

std::map<std::string, int> PerRankValuesLeft(const Manifest& manifest) {
  std::map<std::string, int> left;
  auto recorded = manifest.created.user.find(kPerRankValuesLeftKey);
  if (recorded == manifest.created.user.end()) return left;
  const nlohmann::json parsed = nlohmann::json::parse(recorded->second, nullptr, false);
  if (!parsed.is_object()) return left;
  for (const auto& [name, world] : parsed.items()) {
    if (world.is_number_integer() && world.get<int64_t>() >= 1 && world.get<int64_t>() <= kMaxWorldSize) {
      left.emplace(name, world.get<int>());
    }
  }
  return left;
}

std::string EncodePerRankValuesLeft(const std::map<std::string, int>& left) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, world] : left) out[name] = world;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string PerRankValueLeftReason(int saved_by) {
  // Not the size it was resharded to: after two reshards the manifest names only the last.
  return "per-rank blob saved by " + std::to_string(saved_by) +
         " ranks, left out when the checkpoint was resharded (it belongs to those ranks), so it is not restored";
}

}  // namespace shardckpt
