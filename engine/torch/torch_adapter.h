// The one place libtorch meets the engine: at::Tensor to and from ShardedState pieces.
// Tensors are used in place (no copy): they must be contiguous CPU tensors, or CUDA tensors in a
// build with CUDA (staged through pinned memory by the save path).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "shardckpt/engine/model/state.h"

namespace shardckpt {

Result<DType> FromTorchDType(at::ScalarType type);
Result<at::ScalarType> ToTorchDType(DType dtype);

// Adds `local` (the piece this rank holds) under `name`. For Whole, the global shape is the
// tensor's own; otherwise pass the global shape.
Status AddTorchTensor(ShardedState& state, const std::string& name, const at::Tensor& local,
                 const Layout& layout = Layout::Whole(), const Shape& global_shape = {});

// The torch version this binary was built against, for the manifest's creation facts.
std::string TorchVersion();

}  // namespace shardckpt
