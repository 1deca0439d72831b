// Bytes as text, as the formats carry them: base64 (bytes values in the typed JSON of
// python/shardckpt/_state.py) and lowercase hex (SHA-256 digests in .sha256 files, integers past
// 64 bits in the typed JSON).
#pragma once

#include <string>
#include <string_view>

#include "shardckpt/io/status.h"

namespace shardckpt {

std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);
std::string HexEncode(std::string_view bytes);
// Lowercase hex of an even length; anything else is InvalidArgument naming `what`.
Result<std::string> HexDecode(std::string_view text, const char* what);

}  // namespace shardckpt
