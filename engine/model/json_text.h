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
// `text` with each byte that does not start a valid UTF-8 sequence replaced by U+FFFD: for
// text that only informs (a source path in the creation metadata), where a folder name that is
// not UTF-8 must not fail the work.
std::string Utf8OrReplaced(std::string_view text);
// A path's bytes as a pickle stores the str os.fsdecode makes of them: each byte that starts no
// valid UTF-8 sequence as the lone surrogate U+DC80..U+DCFF, written as Python's pickle writes
// one ("surrogatepass"), so Python reads back the path that names the folder.
std::string PythonPathText(std::string_view path);
void AppendJsonUint(std::string* out, uint64_t value);
void AppendJsonInt(std::string* out, int64_t value);
// The shortest text that reads back to `value`, with ".0" added to an integral value so that it
// reads back as a floating-point number; `null` for NaN and infinities (JSON has no such number).
void AppendJsonDouble(std::string* out, double value);

}  // namespace shardckpt
