// The CUDA half of device_memory.h. Host code only (no kernels): it is a .cu so that CUDA builds
// compile it with nvcc against the toolkit the project was configured with.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardckpt/io/cuda_device_scope.h"
#include "shardckpt/io/device_memory.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

Status CudaStatus(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return Status::Ok();
  return Status(Code::kIoError, std::string(call) + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

void* PinnedAllocate(size_t bytes) {
  void* ptr = nullptr;
  // Portable: any device's stream may copy from it. cudaHostAlloc memory is page-aligned, which
  // O_DIRECT needs as well.
  if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) return nullptr;
  return ptr;
}
void PinnedRelease(void* ptr) { cudaFreeHost(ptr); }

class CudaDeviceCopier final : public DeviceCopier {
 public:
  static Result<std::unique_ptr<CudaDeviceCopier>> Create(int device) {
    auto copier = std::unique_ptr<CudaDeviceCopier>(new CudaDeviceCopier(device));
    CudaDeviceScope scope(device);
    SC_RETURN_IF_ERROR(CudaStatus(scope.status(), "cudaSetDevice"));
    // Non-blocking: the engine's copies never wait on, or hold up, the training's default stream.
    SC_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&copier->stream_, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags"));
    return std::move(copier);
  }
  ~CudaDeviceCopier() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int device() const override { return device_; }

  Status CopyToHostAsync(void* host, const void* device, size_t bytes, size_t slot) override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(CudaStatus(scope.status(), "cudaSetDevice"));
    SC_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_),
                                  "cudaMemcpyAsync (device to host)"));
    SC_ASSIGN_OR_RETURN(cudaEvent_t event, EventFor(slot));
    return CudaStatus(cudaEventRecord(event, stream_), "cudaEventRecord");
  }

  Status WaitSlot(size_t slot) override {
    SC_ASSIGN_OR_RETURN(cudaEvent_t event, EventFor(slot));
    return CudaStatus(cudaEventSynchronize(event), "cudaEventSynchronize");
  }

  Status CopyToDeviceAsync(void* device, const void* host, size_t bytes) override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(CudaStatus(scope.status(), "cudaSetDevice"));
    return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (host to device)");
  }

  Status Synchronize() override { return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  Status WaitForDeviceWork() override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(CudaStatus(scope.status(), "cudaSetDevice"));
    return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

 private:
  explicit CudaDeviceCopier(int device) : device_(device) {}

  Result<cudaEvent_t> EventFor(size_t slot) {
    while (events_.size() <= slot) {
      cudaEvent_t event;
      // Timing off: these events only order copies against writes.
      SC_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
      events_.push_back(event);
    }
    return events_[slot];
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

bool CudaDevicePresent() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Result<DeviceCopier*> CudaCopier(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaDeviceCopier>> copiers;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = copiers.find(device);
  if (it != copiers.end()) return static_cast<DeviceCopier*>(it->second.get());
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || device < 0 || device >= count) {
    return Status(Code::kFailedPrecondition,
                  "CUDA device " + std::to_string(device) + " is not available (" +
                      (rc != cudaSuccess ? std::string(cudaGetErrorString(rc)) : std::to_string(count) + " devices") + ")");
  }
  SC_ASSIGN_OR_RETURN(auto copier, CudaDeviceCopier::Create(device));
  DeviceCopier* raw = copier.get();
  copiers.emplace(device, std::move(copier));
  return raw;
}

HostAllocator StagingHostAllocator(bool want_pinned) {
  if (!want_pinned) return DefaultHostAllocator();
  if (!CudaDevicePresent()) {
    LogOnce(LogLevel::kInfo, "pinned-fallback", "no CUDA device: staging memory is pageable, not pinned");
    return DefaultHostAllocator();
  }
  return HostAllocator{&PinnedAllocate, &PinnedRelease, "pinned"};
}

}  // namespace shardckpt
