#pragma once

namespace shardckpt {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace shardckpt
