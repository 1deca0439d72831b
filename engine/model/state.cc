#include "shardckpt/engine/model/state.h"

namespace shardckpt {

Status ShardedState::AddTensor(const std::string& name, DType dtype, const Shape& global_shape,
                               const Layout& layout, void* data) {
  if (name.empty()) return InvalidArgument("a tensor needs a name");
  Result<int64_t> count = ValidateLayout(layout, global_shape);
  if (!count.ok()) return count.status().WithContext("tensor '" + name + "'");
  SC_RETURN_IF_ERROR(NumBytes(global_shape, DTypeSize(dtype)).status().WithContext("tensor '" + name + "'"));
  int64_t bytes = *count * static_cast<int64_t>(DTypeSize(dtype));
  if (data == nullptr && bytes > 0) return InvalidArgument("tensor '" + name + "' has no data pointer");
  pieces_.push_back(TensorPiece{name, dtype, global_shape, layout, data, bytes});
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
  if (name.empty()) return InvalidArgument("a blob needs a name");
  for (const BlobItem& blob : blobs_) {
    if (blob.name == name) return InvalidArgument("blob '" + name + "' added twice");
  }
  blobs_.push_back(BlobItem{name, scope, std::move(bytes)});
  return Status::Ok();
}

}  // namespace shardckpt
