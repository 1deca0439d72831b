// Executes a ReadPlan: reads extents through the read ring (io/read_ring.h: staging buffers, up
// to pool.count() reads in flight), verifies every 4096-byte block against the checksum table (whose pages are verified
// against the manifest first), and scatters the bytes into the targets. An extent that is one
// whole copy into host memory is read straight into the target instead (aligned targets under
// O_DIRECT; any target on memory-backed file systems, which are opened without O_DIRECT).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/device_memory.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {

struct ReadStats {
  uint64_t data_bytes_read = 0;
  uint64_t table_bytes_read = 0;
  uint64_t extents = 0;
  uint64_t bytes_read_in_place = 0;  // read straight into the targets, no staging copy
  // Read before the plan was known: CheckpointReader's windows read in the background, and a
  // load's read of its own file during the metadata phases (engine/core/read_ahead.h).
  uint64_t bytes_read_ahead = 0;
  uint64_t blocks_verified = 0;
  // Blocks read but verified by another rank of the host instead (SharedBlocks).
  uint64_t blocks_verified_elsewhere = 0;
};

// Blocks that every rank of one host reads from the same page cache (a memory-backed folder):
// the replicated entries every rank reads itself, and the global blobs. Each is verified by one
// of those ranks, its owner, and read unverified by the rest: the load agrees on the read's
// status, so a mismatch the owner finds fails every rank. The others copied the same pages, so
// checking them again would find nothing more, and with every rank reading replicated state
// the checksums were the largest part of the load that a plain read does not pay.
struct SharedBlocks {
  int rank = 0;
  int world = 1;
  std::vector<std::vector<bool>> by_file;  // by manifest.files index, then by data block

  bool VerifiedElsewhere(uint32_t file, uint64_t block) const {
    return file < by_file.size() && block < by_file[file].size() && by_file[file][block] &&
           static_cast<int>((file + block) % static_cast<uint64_t>(world)) != rank;
  }
};

struct ReadTargets {
  std::vector<unsigned char*> base;  // by target index
  // For error messages: the entry or blob each target holds. Views (of the manifest's names, or
  // of labels the caller keeps until the plan has run): a load of thousands of small tensors
  // copied every name here, for messages it almost never writes.
  std::vector<std::string_view> names;
  std::vector<DeviceCopier*> copier; // by target; null (or empty vector) for host memory
};

// One data file whose bytes are being read into memory (engine/core/read_ahead.h): the plan's
// extents there (and its checksum-table pages) are verified and copied from memory, each once
// `arrived` says its bytes are there (null: all of them are); where it says they never will (a
// failed read), they are read from the file.
struct FileInMemory {
  uint32_t file = UINT32_MAX;  // manifest.files index; UINT32_MAX: none
  const unsigned char* data = nullptr;
  uint64_t bytes = 0;
  std::function<bool(uint64_t offset, uint64_t length)> arrived;
};

Status ExecuteReadPlan(IoEngine* io, BufferPool* pool, const std::string& dir,
                       const Manifest& manifest, const ReadPlan& plan, const ReadTargets& targets,
                       bool verify, ReadStats* stats, const FileInMemory& in_memory = {},
                       const SharedBlocks& shared = {});

}  // namespace shardckpt
