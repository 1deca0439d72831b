#include "shardckpt/engine/model/name_list.h"

namespace shardckpt {

std::string NameList(const std::vector<std::string>& names, const std::vector<std::string>& notes) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 20; ++i) {
    out += (i ? ", " : "") + ("'" + names[i] + "'") + (i < notes.size() ? " (" + notes[i] + ")" : "");
  }
  if (names.size() > 20) out += ", and " + std::to_string(names.size() - 20) + " more";
  return out;
}

}  // namespace shardckpt
