#include "shardckpt/engine/torch/torch_adapter.h"

#include <torch/version.h>

namespace shardckpt {

Result<DType> FromTorchDType(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return DType::kFloat64;
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kLong: return DType::kInt64;
    case at::kInt: return DType::kInt32;
    case at::kShort: return DType::kInt16;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kBool: return DType::kBool;
    case at::kComplexFloat: return DType::kComplex64;
    case at::kComplexDouble: return DType::kComplex128;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case at::kUInt16: return DType::kUInt16;
    case at::kUInt32: return DType::kUInt32;
    case at::kUInt64: return DType::kUInt64;
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    case at::kFloat8_e5m2: return DType::kFloat8E5M2;
#endif
    default: return InvalidArgument(std::string("unsupported torch dtype ") + c10::toString(type));
  }
}

Result<at::ScalarType> ToTorchDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt64: return at::kLong;
    case DType::kInt32: return at::kInt;
    case DType::kInt16: return at::kShort;
    case DType::kInt8: return at::kChar;
    case DType::kUInt8: return at::kByte;
    case DType::kBool: return at::kBool;
    case DType::kComplex64: return at::kComplexFloat;
    case DType::kComplex128: return at::kComplexDouble;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case DType::kUInt16: return at::kUInt16;
    case DType::kUInt32: return at::kUInt32;
    case DType::kUInt64: return at::kUInt64;
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    case DType::kFloat8E4M3: return at::kFloat8_e4m3fn;
    case DType::kFloat8E5M2: return at::kFloat8_e5m2;
#endif
    default:
      return InvalidArgument(std::string("dtype ") + DTypeName(dtype) + " has no torch type in torch " +
                             TORCH_VERSION);
  }
}

namespace {

// What AddTorchTensor refuses before the state sees the piece; the dtype and global shape it
// takes otherwise.
Status CheckTorchPiece(const std::string& name, const at::Tensor& local, const Layout& layout, const Shape& global_shape,
                       DType* dtype, Shape* global) {
  if (IsRefusedLayout(layout)) return InvalidArgument("tensor '" + name + "': " + RefusedLayoutReason(layout));
  if (!local.is_contiguous()) {
    return InvalidArgument("tensor '" + name + "' is not contiguous; pass .contiguous() (shardckpt does not copy)");
  }
  if (!local.device().is_cpu() && !local.device().is_cuda()) {
    return InvalidArgument("tensor '" + name + "' is on " + local.device().str() +
                           "; shardckpt saves CPU and CUDA tensors");
  }
  Result<DType> type = FromTorchDType(local.scalar_type());
  if (!type.ok()) return type.status().WithContext("tensor '" + name + "'");
  *dtype = *type;
  if (layout.kind == LayoutKind::kBox && layout.offsets.size() != global_shape.size()) {
    return InvalidArgument("tensor '" + name + "': " + layout.ToString() + " has " + std::to_string(layout.offsets.size()) +
                           " dims, the global shape " + ShapeString(global_shape) + " " +
                           std::to_string(global_shape.size()) +
                           (global_shape.empty() ? ": a piece of a larger tensor needs the whole tensor's shape "
                                                   "(AddTorchTensor's last argument)"
                                                 : ": the box and the global shape must have the same dims"));
  }
  *global = layout.kind == LayoutKind::kWhole && global_shape.empty() ? Shape(local.sizes().begin(), local.sizes().end())
                                                                      : global_shape;
  Shape expected = LocalShape(layout, *global);
  Shape actual(local.sizes().begin(), local.sizes().end());
  Result<int64_t> expected_count = NumElements(expected);
  if (!expected_count.ok() || *expected_count != local.numel()) {
    return InvalidArgument("tensor '" + name + "' has shape " + ShapeString(actual) + " but " + layout.ToString() + " of " +
                           ShapeString(*global) + " needs " + ShapeString(expected));
  }
  return Status::Ok();
}

}  // namespace

Status AddTorchTensor(ShardedState& state, const std::string& name, const at::Tensor& local,
                 const Layout& layout, const Shape& global_shape) {
  DType dtype = DType::kFloat32;
  Shape global;
  Status checked = CheckTorchPiece(name, local, layout, global_shape, &dtype, &global);
  if (!checked.ok()) return state.Refuse(checked);
  if (local.device().is_cuda()) {
    // Saved through pinned staging on shardckpt's own stream: the caller's stream must have
    // finished writing the tensor (as for any cross-stream use), which a snapshot point implies.
    return state.AddDeviceTensor(name, dtype, global, layout, local.data_ptr(), local.device().index());
  }
  return state.AddTensor(name, dtype, global, layout, local.data_ptr());
}

std::string TorchVersion() { return TORCH_VERSION; }

}  // namespace shardckpt
