#include "shardckpt/io/size_text.h"

#include <cstdlib>
#include <map>

namespace shardckpt {

Result<uint64_t> ParseByteSize(const std::string& text) {
  static const std::map<std::string, uint64_t> kUnits = {
      {"", 1},           {"B", 1},           {"KB", 1000},       {"MB", 1000000},    {"GB", 1000000000},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"K", 1ull << 10}, {"k", 1ull << 10},
      {"M", 1ull << 20},  {"G", 1ull << 30}};
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  auto unit = kUnits.find(end);
  if (end == text.c_str() || unit == kUnits.end() || !(value > 0) || value * unit->second > 1.8e19) {
    return InvalidArgument("bad size '" + text + "' (e.g. 5GB, 500MiB, 4096)");
  }
  return static_cast<uint64_t>(value * static_cast<double>(unit->second));
}

}  // namespace shardckpt
