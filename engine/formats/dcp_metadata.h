// The `.metadata` file of a PyTorch Distributed Checkpoint (DCP) folder: a pickle of
// torch.distributed.checkpoint.metadata.Metadata (torch 2.x). Read by a restricted unpickler of
// its own that builds a tree of plain values and never executes anything: each global is checked
// against the fixed list of classes DCP pickles (the metadata dataclasses, _StorageInfo,
// torch.Size, dtypes, layouts, the memory-format enum, pathlib paths) and refused by name
// otherwise; NEWOBJ, BUILD and REDUCE are only recorded as data, with REDUCE interpreted for
// torch.Size, _get_layout, the enum and paths alone. Memory is bounded by UnpickleMemoryBudget.
// Protocols 2 to 5.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

// What the reader found, as stated in the file (named apart from the writer's DcpMetadata in
// dcp_writer.h, which describes a folder about to be written).
struct ParsedDcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

struct ParsedDcpItem {
  std::string name;  // the flattened key (DCP's fqn)
  bool is_bytes = false;
  // Tensors: the dtype, or the torch dtype name shardckpt has no type for (then `unsupported`).
  DType dtype = DType::kFloat32;
  std::string unsupported;
  Shape size;
  std::vector<ParsedDcpChunk> chunks;
};

// One storage_data record: the chunk (fqn, chunk offsets; no offsets for a byte item) and where
// its bytes are.
struct ParsedDcpStorage {
  std::string fqn;
  std::optional<std::vector<int64_t>> offset;
  std::string relative_path;
  uint64_t offset_in_file = 0;
  uint64_t length = 0;
  std::vector<std::string> transforms;  // transform_descriptors (compression extensions)
};

struct ParsedDcpMetadata {
  std::vector<ParsedDcpItem> items;  // in the file's order
  std::vector<ParsedDcpStorage> storage;
  // planner_data: where each flattened key sat in the state dict dcp.save was given, for the keys
  // whose path is more than the key itself and whose steps join to it; malformed ones are left
  // out (they only shape a consolidation's nesting; nothing is read by them).
  std::vector<std::pair<std::string, StatePath>> paths;
  std::string version;  // Metadata.version ("1.0.0"), empty when absent
};

// Parses and checks the shape of what is there (types, arities); `origin` prefixes messages.
// Values are returned as stated: offsets and sizes are checked against the files by dcp_read.h.
Result<ParsedDcpMetadata> ParseDcpMetadata(const std::string& pickle, const std::string& origin);

}  // namespace shardckpt
