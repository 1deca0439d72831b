// A manifest entry's "chunks" list read straight from its text, when it is in the compact form
// EncodeManifest writes: `[[file,offset,bytes,begin,end],[file,offset,bytes,[offsets],[sizes]],...]`
// with no spaces, integers of at most 18 digits. Pure.
//
// Why by hand: a 3-million-chunk manifest is 15 million small integers in short lists, and a
// general JSON reader's per-value work (type checks, iterator state, error plumbing) was most of
// its decode (docs/format.md, benchmarks/README.md). This reader accepts only that one spelling
// and says "not mine" for anything else: the caller then reads the list with the general reader,
// which accepts every valid spelling (an older writer's indented text) and names what is wrong
// with damaged text. So it never has to report an error, only to never accept text that the
// general reader would read differently or refuse.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {

// Reads the list that starts at `text[0]` (its '['), appending its chunks to `out`. Returns the
// length of the list's text (through its closing ']'; `text` may go on after it), or 0 when the
// list is not in the compact form or a value is out of the range the general reader accepts (a
// file index past UINT32_MAX, an integer the reader would not take): `out` then holds an
// unspecified prefix, to be cleared.
size_t ReadCompactChunkList(std::string_view text, std::vector<ChunkRecord>* out);

}  // namespace shardckpt
