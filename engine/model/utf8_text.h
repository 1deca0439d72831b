// UTF-8 validity and what to do with bytes that are not: paths are bytes on Linux, while JSON
// text and Python's str need text. Pure.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardckpt {

// Length of the UTF-8 sequence starting at `s[i]`, or 0 when it is not a valid one (overlong
// forms, surrogates and code points past U+10FFFF refused, as RFC 3629 requires).
size_t Utf8SequenceLength(std::string_view s, size_t i);
// Whether all of `text` is valid UTF-8 (names a format stores as text: GGUF, safetensors, JSON).
bool IsUtf8(std::string_view text);
// `text` with each byte that does not start a valid UTF-8 sequence replaced by U+FFFD: for
// text that only informs (a source path in the creation metadata), where a folder name that is
// not UTF-8 must not fail the work.
std::string Utf8OrReplaced(std::string_view text);
// A path's bytes as a pickle stores the str os.fsdecode makes of them: each byte that starts no
// valid UTF-8 sequence as the lone surrogate U+DC80..U+DCFF, written as Python's pickle writes
// one ("surrogatepass"), so Python reads back the path that names the folder.
std::string PythonPathText(std::string_view path);

}  // namespace shardckpt
