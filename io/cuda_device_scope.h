// For CUDA translation units only (it includes cuda_runtime.h): selects a device for the calls
// in its scope and gives the calling thread its own current device back afterwards. The engine
// runs on the training's threads and must not move them to another GPU.
#pragma once

#include <cuda_runtime.h>

namespace shardckpt {

class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
  }
  ~CudaDeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace shardckpt
