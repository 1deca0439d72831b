#include "shardckpt/engine/model/name_list.h"

namespace shardckpt {

std::string NameList(const std::vector<std::string>& names, const std::vector<std::string>& notes, size_t limit) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    out += (i ? ", " : "") + ("'" + names[i] + "'") + (i < notes.size() ? " (" + notes[i] + ")" : "");
  }
  if (names.size() > limit) out += ", and " + std::to_string(names.size() - limit) + " more";
  return out;
}

}  // namespace shardckpt
