// The CUDA path on a real device: save from device memory through the pinned ring, load
// resharded into device memory, async snapshots of device tensors, and the NCCL communicator.
// Every test skips cleanly where no device is present. The test command builds this wherever
// nvcc is found, but CI has no GPU, so it runs for real only where a person runs it on a machine
// with a device (`ctest --test-dir build -L cuda`).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/device_memory.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"
#ifdef SHARDCKPT_HAVE_NCCL
#include "shardckpt/collectives/nccl_communicator.h"
#endif

namespace shardckpt {
namespace {

#define REQUIRE_DEVICE() \
  if (!CudaDevicePresent()) GTEST_SKIP() << "no CUDA device on this machine"

// Device memory holding given bytes; freed by the destructor.
struct DeviceBytes {
  void* ptr = nullptr;
  size_t size = 0;
  explicit DeviceBytes(const std::vector<uint8_t>& bytes) : size(bytes.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(size, 1)), cudaSuccess);
    if (size) {
      EXPECT_EQ(cudaMemcpy(ptr, bytes.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  DeviceBytes(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(ptr); }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(size);
    if (size) {
      EXPECT_EQ(cudaMemcpy(out.data(), ptr, size, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
};

class CudaTest : public ::testing::Test {
 protected:
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }
  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
};

const Shape kShape{1000, 333};  // rows of 1332 bytes: pieces never align to 4096

TEST_F(CudaTest, StagingMemoryIsPinnedAndPageAligned) {
  REQUIRE_DEVICE();
  HostAllocator pinned = StagingHostAllocator(true);
  EXPECT_STREQ(pinned.name, "pinned");
  Result<AlignedBuffer> buffer = AlignedBuffer::Allocate(1 << 20, pinned);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 4096, 0u);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer->data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
}

TEST_F(CudaTest, SavesFromDeviceAndLoadsReshardedIntoDeviceAndHost) {
  REQUIRE_DEVICE();
  // Saved as 3 row chunks on the device, through a small ring so many buffers cycle.
  std::vector<std::unique_ptr<DeviceBytes>> saved;
  ShardedState state;
  for (int i = 0; i < 3; ++i) {
    Layout rows = ChunkLayout(kShape, 0, 3, i);
    saved.push_back(std::make_unique<DeviceBytes>(testing::PieceBytes("w", DType::kFloat32, kShape, rows)));
    ASSERT_TRUE(state.AddDeviceTensor("w", DType::kFloat32, kShape, rows, saved.back()->ptr, 0).ok());
  }
  DeviceBytes bias(testing::PieceBytes("b", DType::kBFloat16, {333}, Layout::Whole()));
  ASSERT_TRUE(state.AddDeviceTensor("b", DType::kBFloat16, {333}, Layout::Whole(), bias.ptr, 0).ok());
  SaveOptions save_options;
  save_options.staging_buffer_bytes = 64 << 10;
  save_options.staging_buffers = 4;
  Result<SaveResult> result = Save(*comm_, root(), 7, state, save_options);
  ASSERT_TRUE(result.ok()) << result.status().ToString();

  // Loaded as 4 column chunks on the device and the bias into host memory.
  std::vector<std::unique_ptr<DeviceBytes>> loaded;
  std::vector<uint8_t> host_bias(333 * 2, 0xAB);
  ShardedState targets;
  for (int i = 0; i < 4; ++i) {
    Layout cols = ChunkLayout(kShape, 1, 4, i);
    std::vector<uint8_t> poison(testing::PieceBytes("w", DType::kFloat32, kShape, cols).size(), 0xCD);
    loaded.push_back(std::make_unique<DeviceBytes>(poison));
    ASSERT_TRUE(targets.AddDeviceTensor("w", DType::kFloat32, kShape, cols, loaded.back()->ptr, 0).ok());
  }
  ASSERT_TRUE(targets.AddTensor("b", DType::kBFloat16, {333}, Layout::Whole(), host_bias.data()).ok());
  Result<LoadReport> report = Load(*comm_, root(), targets);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(loaded[i]->Read(), testing::PieceBytes("w", DType::kFloat32, kShape, ChunkLayout(kShape, 1, 4, i)))
        << "column chunk " << i;
  }
  EXPECT_EQ(host_bias, testing::PieceBytes("b", DType::kBFloat16, {333}, Layout::Whole()));
}

TEST_F(CudaTest, AsyncSnapshotOfDeviceTensorsIsTakenBeforeSaveReturns) {
  REQUIRE_DEVICE();
  std::vector<uint8_t> before = testing::PieceBytes("w", DType::kFloat32, kShape, Layout::Whole());
  DeviceBytes tensor(before);
  ShardedState state;
  ASSERT_TRUE(state.AddDeviceTensor("w", DType::kFloat32, kShape, Layout::Whole(), tensor.ptr, 0).ok());
  auto saver = AsyncSaver::Create(*comm_);
  ASSERT_TRUE(saver.ok());
  auto handle = (*saver)->Save(root(), 1, state);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  // The training step that follows changes the tensor at once, on the default stream.
  ASSERT_EQ(cudaMemset(tensor.ptr, 0x5A, tensor.size), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE((*handle)->Wait().ok());
  std::vector<uint8_t> got(before.size(), 0);
  ShardedState targets;
  ASSERT_TRUE(targets.AddTensor("w", DType::kFloat32, kShape, Layout::Whole(), got.data()).ok());
  ASSERT_TRUE(Load(*comm_, root(), targets).ok());
  EXPECT_EQ(got, before);
}

#ifdef SHARDCKPT_HAVE_NCCL
TEST_F(CudaTest, NcclCommunicatorMovesDeviceData) {
  REQUIRE_DEVICE();
  auto nccl = CreateNcclCommunicator(*comm_, 0);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  std::vector<float> values = {1, 2, 3, 4};
  std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(values.data()), reinterpret_cast<uint8_t*>(values.data() + 4));
  DeviceBytes send(bytes), recv(std::vector<uint8_t>(16, 0));
  ASSERT_TRUE((*nccl)->Broadcast(send.ptr, 16, 0).ok());
  ASSERT_TRUE((*nccl)->AllGatherFloat(static_cast<float*>(send.ptr), 4, static_cast<float*>(recv.ptr)).ok());
  EXPECT_EQ(recv.Read(), bytes);
  DeviceBytes summed(std::vector<uint8_t>(16, 0));
  ASSERT_TRUE((*nccl)->ReduceScatterSumFloat(static_cast<float*>(send.ptr), static_cast<float*>(summed.ptr), 4).ok());
  EXPECT_EQ(summed.Read(), bytes);  // one rank: the sum is the input
  ASSERT_TRUE((*nccl)->Barrier().ok());
}
#endif

}  // namespace
}  // namespace shardckpt
