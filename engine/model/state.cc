#include "shardckpt/engine/model/state.h"

#include <nlohmann/json.hpp>

#include <xxhash.h>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/utf8_text.h"

namespace shardckpt {

namespace {

// Folds 8-byte fields into a running XXH3 seed, a bufferful at a time (one XXH3 call per piece
// for shapes of up to about eight dims).
class FieldFold {
 public:
  explicit FieldFold(uint64_t seed) : seed_(seed) {}
  void Add(int64_t v) {
    if (count_ == kCapacity) Flush();
    fields_[count_++] = v;
  }
  template <class Ints>  // Shape or Dims: the count, then the values
  void AddAll(const Ints& values) {
    Add(static_cast<int64_t>(values.size()));
    for (int64_t v : values) Add(v);
  }
  uint64_t Done() {
    Flush();
    return seed_;
  }

 private:
  void Flush() {
    seed_ = XXH3_64bits_withSeed(fields_, count_ * sizeof(int64_t), seed_);
    count_ = 0;
  }
  static constexpr size_t kCapacity = 32;
  int64_t fields_[kCapacity];
  size_t count_ = 0;
  uint64_t seed_;
};

}  // namespace

uint64_t FoldPieceDescription(uint64_t digest, const TensorPiece& piece) {
  FieldFold fold(XXH3_64bits_withSeed(piece.name.data(), piece.name.size(), digest));
  fold.Add(static_cast<int64_t>(piece.dtype));
  fold.AddAll(piece.global_shape);
  fold.Add(static_cast<int64_t>(piece.layout.kind));
  fold.AddAll(piece.layout.offsets);
  fold.AddAll(piece.layout.sizes);
  fold.Add(piece.layout.begin);
  fold.Add(piece.layout.end);
  fold.Add(piece.bytes);
  return fold.Done();
}

Status ShardedState::Refuse(Status why) {
  if (refusal_.ok()) refusal_ = why;
  return why;
}

Status ShardedState::CheckNothingRefused() const {
  if (refusal_.ok()) return refusal_;
  return Status(refusal_.code(), refusal_.message() +
                                     " (refused when it was added; a state without it is neither saved nor loaded)");
}

Status ShardedState::AddTensor(const std::string& name, DType dtype, const Shape& global_shape,
                               const Layout& layout, void* data) {
  return AddPiece(name, dtype, global_shape, layout, data, std::nullopt);
}

Status ShardedState::AddTensor(const std::string& name, DType dtype, const Shape& global_shape,
                               const Layout& layout, void* data, size_t data_bytes) {
  return AddPiece(name, dtype, global_shape, layout, data, data_bytes);
}

Status ShardedState::AddPiece(const std::string& name, DType dtype, const Shape& global_shape, const Layout& layout,
                              void* data, std::optional<size_t> data_bytes) {
  if (name.empty()) return Refuse(InvalidArgument("a tensor needs a name"));
  if (name.find('\0') != std::string::npos) {
    return Refuse(InvalidArgument("tensor '" + WithNulsShown(name) + "': its name has a NUL byte in it"));
  }
  if (IsRefusedLayout(layout)) return Refuse(InvalidArgument("tensor '" + name + "': " + RefusedLayoutReason(layout)));
  Result<int64_t> count = ValidateLayout(layout, global_shape);
  if (!count.ok()) return Refuse(count.status().WithContext("tensor '" + name + "'"));
  Status size_ok = NumBytes(global_shape, DTypeSize(dtype)).status();
  if (!size_ok.ok()) return Refuse(size_ok.WithContext("tensor '" + name + "'"));
  int64_t bytes = *count * static_cast<int64_t>(DTypeSize(dtype));
  if (data == nullptr && bytes > 0) return Refuse(InvalidArgument("tensor '" + name + "' has no data pointer"));
  if (data_bytes && static_cast<uint64_t>(bytes) > *data_bytes) {
    return Refuse(InvalidArgument("tensor '" + name + "': " + layout.ToString() + " of " + ShapeString(global_shape) +
                                  " is " + ShapeString(LocalShape(layout, global_shape)) + " of " + DTypeName(dtype) +
                                  ", " + std::to_string(bytes) + " bytes, but the buffer given holds " +
                                  std::to_string(*data_bytes)));
  }
  pieces_.push_back(TensorPiece{name, dtype, global_shape, layout, data, bytes});
  pieces_digest_ = FoldPieceDescription(pieces_digest_, pieces_.back());
  return Status::Ok();
}

Status ShardedState::AddDeviceTensor(const std::string& name, DType dtype, const Shape& global_shape,
                                     const Layout& layout, void* device_data, int device) {
  SC_RETURN_IF_ERROR(AddTensor(name, dtype, global_shape, layout, device_data));
  pieces_.back().space = MemorySpace::kCuda;
  pieces_.back().device = device;
  return Status::Ok();
}

bool ShardedState::has_device_pieces() const {
  for (const TensorPiece& p : pieces_) {
    if (p.space == MemorySpace::kCuda) return true;
  }
  return false;
}

Status ShardedState::AddBlob(const std::string& name, std::string bytes, BlobScope scope) {
  if (name.empty()) return Refuse(InvalidArgument("a blob needs a name"));
  if (name.find('\0') != std::string::npos) {
    return Refuse(InvalidArgument("value '" + WithNulsShown(name) + "': its name has a NUL byte in it"));
  }
  for (const BlobItem& blob : blobs_) {
    if (blob.name == name) return Refuse(InvalidArgument("blob '" + name + "' added twice"));
  }
  blobs_.push_back(BlobItem{name, scope, std::move(bytes)});
  return Status::Ok();
}

Status ShardedState::AddValue(const std::string& name, const std::string& json, BlobScope scope) {
  if (!nlohmann::json::accept(json)) {
    return Refuse(InvalidArgument("value '" + WithNulsShown(name) + "': '" + Utf8OrReplaced(json.substr(0, 80)) +
                                  "' is not JSON text (a string needs its quotes: \"\\\"cosine\\\"\")"));
  }
  return AddBlob(name, std::string(kValueBlobTag, sizeof(kValueBlobTag) - 1) + json, scope);
}

}  // namespace shardckpt
