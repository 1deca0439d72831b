// Where each chunk (or blob) of a data file starts (docs/format.md, "Data files"). Pure.
//
// Format 1.0 started every chunk on a 4096-byte block, so a 16-byte bias took 4 KiB and a state
// dict of many small tensors, cut into one piece per rank, was mostly padding. Since 1.1, chunks
// smaller than kPackBelowBytes are packed: each starts at the next multiple of its element size
// (its natural alignment, so nothing is lost between float32 pieces), sharing blocks with its
// neighbours. Larger chunks still start on a block: their O_DIRECT writes and reads can go
// straight from and into the caller's memory, and their padding is at most 4095 / kPackBelowBytes
// (0.4%) of their size. Checksums stay per 4096-byte block of the data area, and readers always
// read the enclosing blocks, so nothing else about the file changes.
#pragma once

#include <cstdint>

#include "shardckpt/io/checksum.h"

namespace shardckpt {

inline constexpr uint64_t kPackBelowBytes = 1ull << 20;

struct ChunkPacking {
  bool pack = true;  // false: every chunk on a block, as format 1.0 wrote
  uint64_t pack_below = kPackBelowBytes;
};

// The offset of a chunk of `bytes` whose elements are `element_size` bytes (1 for blobs), when the
// file's next free byte is `position`. Empty chunks hold nothing: they get the next block boundary
// without consuming it, so they never cost padding nor break a run of block-aligned chunks.
uint64_t ChunkOffset(uint64_t position, uint64_t bytes, uint64_t element_size, const ChunkPacking& packing = {});

// Whether a manifest with this offset needs format 1.1 (1.0 readers refuse unaligned offsets).
inline bool IsPackedOffset(uint64_t offset) { return offset % kBlockSize != 0; }

}  // namespace shardckpt
