// The manifest as rank 0 of a load sends it to the other ranks, once it has decoded and validated
// the text: a compact binary form (wire.h's variable-length integers) that every other rank
// turns back into the same Manifest without parsing JSON. Never written to disk. Pure.
//
// Why not share the text: every rank then parsed it, and on a node of many ranks those parses
// shared its cores (16 ranks on 2 cores: 16 parses of a 214,000-chunk manifest were most of a
// load of 20,000 small tensors). Reading this form is a few bytes per integer and no JSON.
#pragma once

#include <string>
#include <string_view>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {

// Every field of `manifest`: EncodeManifest of the decoded message gives the same text.
std::string EncodeManifestMessage(const Manifest& manifest);
// Bounds-checked (allocations at most a small multiple of the message's size), but not validated: the sender
// validated the manifest. DataLoss naming `origin` when the bytes are not such a message.
Result<Manifest> DecodeManifestMessage(const std::string& message, const std::string& origin);

}  // namespace shardckpt
