// The names an error message lists: a message about a state of 20,000 tensors must not carry
// all 20,000 of them.
#pragma once

#include <string>
#include <vector>

namespace shardckpt {

// Up to `limit` quoted names, then "and N more"; with `notes`, each name followed by its own note
// ("'w' (2 of 4 elements)").
std::string NameList(const std::vector<std::string>& names, const std::vector<std::string>& notes = {},
                     size_t limit = 20);

}  // namespace shardckpt
