// Device memory on the save and load paths. Save reads a CUDA tensor through device-to-host
// copies into the pinned staging ring, on the engine's own stream with one event per staging
// buffer, so the copy into buffer k+1 overlaps the O_DIRECT writes of buffers k, k-1, ...; load
// scatters verified bytes from staging to the device with host-to-device copies.
//
// Builds without CUDA keep the same interface: CudaCopier() says why there is none, and a piece
// that claims to live on a device is refused with that reason instead of being read as host memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

enum class MemorySpace : uint8_t { kHost, kCuda };

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual int device() const = 0;
  // Enqueues device -> host (pinned) and records `slot`'s event after it.
  virtual Status CopyToHostAsync(void* host, const void* device, size_t bytes, size_t slot) = 0;
  // Returns when every copy enqueued for `slot` has landed in host memory.
  virtual Status WaitSlot(size_t slot) = 0;
  // Enqueues host -> device; the host bytes must stay put until Synchronize returns.
  virtual Status CopyToDeviceAsync(void* device, const void* host, size_t bytes) = 0;
  virtual Status Synchronize() = 0;
  // Waits for all work already queued on the device, on any stream: the snapshot point after
  // which the training's kernels have finished writing the tensors about to be copied (our
  // stream does not order itself after theirs).
  virtual Status WaitForDeviceWork() = 0;
};

// Whether this build has CUDA and the process sees at least one device.
bool CudaDevicePresent();
// The copier for `device`, created on first use and kept for the process (its stream and events
// are reused by every save and load). Not thread-safe across concurrent users of one device.
Result<DeviceCopier*> CudaCopier(int device);
// Pinned (page-locked, cudaHostAlloc) host memory when a device is present, so D2H and H2D run
// at full link speed and asynchronously; the aligned default otherwise.
HostAllocator StagingHostAllocator(bool want_pinned);

}  // namespace shardckpt
