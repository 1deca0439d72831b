// A manifest's "entries" list, and an entry's "chunks" list, read straight from their text when
// they are in the compact form EncodeManifest writes. A chunk list is
// `[[file,offset,bytes,begin,end],[file,offset,bytes,[offsets],[sizes]],...]` with no spaces,
// integers of at most 18 digits; the entries list is one entry per line (below). Pure.
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

// Reads the entries list that starts at `text[0]` (its '['), replacing `out` with its entries, in
// exactly the spelling EncodeManifest writes:
//   [\n  {"name": "N", "dtype": "D", "shape": [d,...], "chunks": CHUNKS},\n  {...}\n ]   or   []
// where N has nothing to unescape (no quote, backslash or control character) and is valid UTF-8,
// D is a dtype this build knows, and CHUNKS is a compact chunk list. Returns the length through
// the closing ']', or 0 for any other spelling or value (`out` is then unspecified): the general
// reader then reads the list, and names what is wrong with it.
//
// Why: the entries are nearly all of a large manifest's text. Read here, the general reader never
// indexes or skips them: DecodeManifest gives it the text with this list cut out.
//
// `threads` > 1 reads parts of a list of at least a MiB per thread side by side, each from an
// entry's separator on, with the same result (the tools at 64 ranks: a million chunks).
size_t ReadCompactEntryList(std::string_view text, std::vector<EntryRecord>* out, size_t threads = 1);

}  // namespace shardckpt
