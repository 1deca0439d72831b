// What a rank hands to Save and Load: its pieces of named tensors (host memory it owns, or CUDA
// device memory) and its blobs. The engine never copies these descriptions' data before it needs to: Save reads from the
// pointers, Load writes into them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/device_memory.h"

namespace shardckpt {

struct TensorPiece {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  Layout layout;
  void* data = nullptr;  // row-major bytes of LocalShape(layout, global_shape)
  int64_t bytes = 0;
  MemorySpace space = MemorySpace::kHost;
  int device = 0;  // for kCuda
};

struct BlobItem {
  std::string name;
  BlobScope scope = BlobScope::kGlobal;
  std::string bytes;
};

// What a blob holding a plain value starts with; its typed JSON follows (python/shardckpt/_state.py:
// JSON's own types as they are, a tuple, bytes or an int past 64 bits tagged).
inline constexpr const char kValueBlobTag[] = "\0J";

class ShardedState {
 public:
  // Adds a piece; for saving, `data` is read, for loading it is written. A rank may hold several
  // pieces of one entry (layouts must not overlap).
  Status AddTensor(const std::string& name, DType dtype, const Shape& global_shape,
                   const Layout& layout, void* data);
  // The same, given the size of the buffer at `data`: refused, naming the tensor and both sizes,
  // when the piece needs more bytes than that (a buffer sized for another shape or dtype would
  // be read past its end by a save and written past it by a load).
  Status AddTensor(const std::string& name, DType dtype, const Shape& global_shape,
                   const Layout& layout, void* data, size_t data_bytes);
  // The same for a piece in CUDA device memory (a raw device pointer, or a CUDA tensor's
  // data_ptr()). Saved through pinned staging, loaded by host-to-device copies.
  Status AddDeviceTensor(const std::string& name, DType dtype, const Shape& global_shape,
                         const Layout& layout, void* device_data, int device);
  Status AddBlob(const std::string& name, std::string bytes, BlobScope scope = BlobScope::kGlobal);
  // A plain value, as JSON text ("20", "0.001", "\"cosine\"", "[1, 2]", "{\"lr\": 0.1}",
  // "null"): stored as a value blob (kValueBlobTag, then the text), which `consolidate` writes
  // into the .pt as the Python value (an int, a float, a str, a list, a dict) and Python's load
  // returns as one; AddBlob's bytes are bytes. Refused when `json` is not JSON text. The JSON is
  // the Python package's typed JSON: an object with a "__shardckpt__" key is one of its tags
  // (a tuple, bytes), and a per-rank value (kPerRank) is restored by a load, never consolidated.
  Status AddValue(const std::string& name, const std::string& json, BlobScope scope = BlobScope::kGlobal);
  // The first addition this state refused (Ok when none). Save and Load refuse such a state on
  // every rank with it: a Status left unchecked must not leave a tensor out of a checkpoint.
  const Status& refusal() const { return refusal_; }
  // Records `why` as a refused addition (the first is kept) and returns it: for adapters that
  // refuse a piece before it reaches AddTensor (engine/torch).
  Status Refuse(Status why);
  // Ok, or the refusal said as the reason a save or load of this state is refused.
  Status CheckNothingRefused() const;

  const std::vector<TensorPiece>& pieces() const { return pieces_; }
  // Piece `index` lands in (is read from) the host memory at `data` instead, for a load's copy of
  // the state (engine/core/tied_targets.h: one name of a tied pair read into a buffer of its own).
  // The digest is unchanged: it describes the pieces, not where their bytes are.
  void MovePieceToHost(size_t index, void* data) {
    pieces_[index].data = data;
    pieces_[index].space = MemorySpace::kHost;
    pieces_[index].device = 0;
  }
  const std::vector<BlobItem>& blobs() const { return blobs_; }
  bool has_device_pieces() const;
  // A digest of the pieces' descriptions in order (name, dtype, shape, layout, size; not the
  // data), folded in as each is added: a repeat save compares it with the last plan's, and
  // hashing 20,000 pieces afterwards meant a cache miss or more per field.
  uint64_t pieces_digest() const { return pieces_digest_; }
  void Clear() {
    pieces_.clear();
    blobs_.clear();
    pieces_digest_ = 0;
    refusal_ = Status::Ok();
  }

 private:
  // Both AddTensors: `data_bytes`, where given, the size of the buffer at `data`.
  Status AddPiece(const std::string& name, DType dtype, const Shape& global_shape, const Layout& layout, void* data,
                  std::optional<size_t> data_bytes);
  std::vector<TensorPiece> pieces_;
  std::vector<BlobItem> blobs_;
  uint64_t pieces_digest_ = 0;
  Status refusal_;
};

// `digest` with the description of `piece` folded in (ShardedState::pieces_digest).
uint64_t FoldPieceDescription(uint64_t digest, const TensorPiece& piece);

}  // namespace shardckpt
