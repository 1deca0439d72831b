// device_memory.h for builds without CUDA: nothing lives on a device, so any piece that says it
// does is refused with the reason.
#include "shardckpt/io/device_memory.h"

namespace shardckpt {

bool CudaDevicePresent() { return false; }

Result<DeviceCopier*> CudaCopier(int device) {
  return Status(Code::kUnimplemented, "CUDA device " + std::to_string(device) +
                                          " requested, but this shardckpt was built without CUDA "
                                          "(configure where nvcc is found, SHARDCKPT_WITH_CUDA=ON)");
}

HostAllocator StagingHostAllocator(bool) { return DefaultHostAllocator(); }

}  // namespace shardckpt
