// The keys of one JSON object in the order a text gives them. nlohmann's ordered_json finds each
// key by a linear search, and its parse callback rescans the parent object whenever a nested
// object ends: both are quadratic, minutes for a safetensors header or index of 100,000 tensors.
// A SAX pass here records the order, and the values are read from a sorted nlohmann::json.
#pragma once

#include <string>
#include <vector>

namespace shardckpt {

struct JsonKeys {
  bool found = false;           // the text is JSON and holds an object at the path
  std::vector<std::string> names;
  std::string duplicate;        // the first key given twice in that object ("" if none)
  bool too_deep = false;        // containers nest deeper than kMaxJsonDepth: the pass stopped there
};

// Deeper than any header or index this reads: a text of nothing but '[' (a 100 MB safetensors
// header) costs tens of bytes per level in a parser, gigabytes in all. Callers refuse such text
// before building a document of it.
inline constexpr size_t kMaxJsonDepth = 64;

// `path`: the keys leading from the top-level object to the object wanted (empty: the top-level
// object itself). Nothing is found in a text that does not parse.
JsonKeys JsonObjectKeys(const std::string& text, const std::vector<std::string>& path);

}  // namespace shardckpt
