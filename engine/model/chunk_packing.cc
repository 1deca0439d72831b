#include "shardckpt/engine/model/chunk_packing.h"

#include "shardckpt/io/checksum.h"

namespace shardckpt {

uint64_t ChunkOffset(uint64_t position, uint64_t bytes, uint64_t element_size, const ChunkPacking& packing) {
  if (bytes == 0 || !packing.pack || bytes >= packing.pack_below) return AlignUp(position, kBlockSize);
  if (element_size == 0) element_size = 1;
  return (position + element_size - 1) / element_size * element_size;
}

}  // namespace shardckpt
