// JSON text written by hand, for documents too large for a DOM: a manifest.json of millions of
// chunks is written straight into one string (no tree of nodes to allocate and free), with the
// same escaping and number spelling a JSON library would use. Pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardckpt {

// Appends `text` as a JSON string, quotes included: `"` and `\` escaped, control characters as
// \b \f \n \r \t or \u00XX, everything else (UTF-8 included) as it is. Returns false, leaving
// `out` unchanged, when `text` is not valid UTF-8 (JSON text must be).
bool AppendJsonString(std::string* out, std::string_view text);
void AppendJsonUint(std::string* out, uint64_t value);
void AppendJsonInt(std::string* out, int64_t value);
// The shortest text that reads back to `value`, with ".0" added to an integral value so that it
// reads back as a floating-point number; `null` for NaN and infinities (JSON has no such number).
void AppendJsonDouble(std::string* out, double value);

}  // namespace shardckpt
