// The encodings of a PyTorch Distributed Checkpoint (DCP) folder as torch 2.x's FileSystemWriter
// writes it (docs/format.md, "DCP"): the pickled `.metadata` (Metadata with TensorStorageMetadata,
// TensorProperties, ChunkStorageMetadata, BytesStorageMetadata, MetadataIndex -> _StorageInfo,
// StorageMeta, version "1.0.0"), and the pickles inside the torch.save zips the `.distcp` files
// hold back to back: one per tensor chunk (torch.load(weights_only=True) gives the chunk as a
// contiguous tensor) and one per byte item (torch.load gives the Python value). Pure: no I/O.
// The writer of the folder is engine/core/dcp_export.h.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

// Where one item's torch.save zip lies: `file` (a plain name in the folder), [offset, offset+length).
struct DcpStorage {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DcpChunk {
  std::vector<int64_t> offsets;  // into the global tensor
  std::vector<int64_t> sizes;
  DcpStorage storage;
};

struct DcpTensor {
  std::string fqn;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::vector<DcpChunk> chunks;  // tiling the tensor, none for a tensor of no elements
};

struct DcpBytes {
  std::string fqn;
  DcpStorage storage;
};

struct DcpMetadata {
  std::vector<DcpTensor> tensors;
  std::vector<DcpBytes> bytes;
  // planner_data's paths of the keys that sat deeper than the key itself (a checkpoint read from,
  // or imported from, a DCP folder: kTorchPathsKey); every other key is its own one-step path.
  std::unordered_map<std::string, StatePath> paths;
  // The keys' order in state_dict_metadata (dcp_to_torch_save's, and dcp.load's of no target) as
  // (is a byte item, index into tensors or bytes); empty: the tensors, then the byte items.
  std::vector<std::pair<bool, size_t>> order;
  std::string checkpoint_id;  // StorageMeta.checkpoint_id: the folder, as the writer named it
};

inline constexpr const char* kDcpMetadataName = ".metadata";
inline constexpr const char* kDcpVersion = "1.0.0";

// The `.metadata` pickle. planner_data maps every fqn to (fqn,), so dcp_to_torch_save gives a
// flat state dict of dotted names, as a model's state_dict() has them.
std::string EncodeDcpMetadata(const DcpMetadata& metadata);

// The data.pkl of torch.save(t) for a contiguous tensor `t` of `dtype` and `sizes` whose bytes
// are record data/0, written as torch 2.x writes it (_rebuild_tensor_v2 with the typed storage
// class; float8 through an UntypedStorage and _rebuild_tensor_v3).
std::string PickleContiguousTensor(DType dtype, const Shape& sizes);

// The pickle of the Python value a shardckpt blob holds, for a DCP byte item: the Python
// package's typed JSON (None, bool, int, float, str, bytes, list, tuple, dict) and raw bytes
// (tagged, or untagged as the C++ API writes them). A tensor blob (PerRank tensors) or a value
// that cannot be represented is refused with the reason.
Result<std::string> PickleBlobValue(const std::string& blob);

}  // namespace shardckpt
