#include "shardckpt/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <string>

#include "shardckpt/collectives/mpi_deadline.h"
#include "shardckpt/io/cuda_device_scope.h"

namespace shardckpt {
namespace {

Status NcclStatus(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return Status::Ok();
  return Status(Code::kIoError, std::string(call) + " failed: " + ncclGetErrorString(rc));
}

Status CudaStatus(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return Status::Ok();
  return Status(Code::kIoError, std::string(call) + " failed: " + cudaGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device) : bootstrap_(bootstrap), device_(device) {}
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Each step that one rank can fail alone is agreed on before the next collective: the id's
  // broadcast, then ncclCommInitRank, which waits for every rank.
  Status Init() {
    ncclUniqueId id{};
    Status created;
    if (bootstrap_.rank() == 0) created = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId on rank 0");
    SC_RETURN_IF_ERROR(BroadcastStatus(bootstrap_, created, 0));
    SC_RETURN_IF_ERROR(bootstrap_.Broadcast(&id, sizeof(id), 0));
    CudaDeviceScope scope(device_);
    Status local = CudaStatus(scope.status(), "cudaSetDevice");
    if (local.ok()) local = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (local.ok()) local = CudaStatus(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    SC_RETURN_IF_ERROR(AgreeOnStatus(bootstrap_, local));
    return NcclStatus(ncclCommInitRank(&comm_, bootstrap_.size(), id, bootstrap_.rank()), "ncclCommInitRank");
  }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  const char* name() const override { return "nccl"; }
  bool thread_safe() const override { return false; }

  Status Barrier() override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(Ready(scope));
    SC_RETURN_IF_ERROR(NcclStatus(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_),
                                  "ncclAllReduce"));
    return Finish();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(Ready(scope));
    SC_RETURN_IF_ERROR(
        NcclStatus(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast"));
    return Finish();
  }

  Status Gather(const std::string& mine, std::vector<std::string>* all, int root) override {
    return bootstrap_.Gather(mine, all, root);
  }
  Status AllGather(const std::string& mine, std::vector<std::string>* all) override {
    return bootstrap_.AllGather(mine, all);
  }
  Status AllReduceMaxInt64(int64_t* values, size_t count) override { return bootstrap_.AllReduceMaxInt64(values, count); }
  Status AllReduceSumDouble(double* values, size_t count) override {
    return bootstrap_.AllReduceSumDouble(values, count);
  }

  Status AllGatherFloat(const float* send, size_t count, float* recv) override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(Ready(scope));
    SC_RETURN_IF_ERROR(NcclStatus(ncclAllGather(send, recv, count, ncclFloat, comm_, stream_), "ncclAllGather"));
    return Finish();
  }

  Status ReduceScatterSumFloat(const float* send, float* recv, size_t count) override {
    CudaDeviceScope scope(device_);
    SC_RETURN_IF_ERROR(Ready(scope));
    SC_RETURN_IF_ERROR(
        NcclStatus(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm_, stream_), "ncclReduceScatter"));
    return Finish();
  }

  Result<std::unique_ptr<Communicator>> Duplicate() override { return CreateNcclCommunicator(bootstrap_, device_); }

 private:
  // Every data-plane call: its device selected, and a communicator not aborted by a failure.
  Status Ready(const CudaDeviceScope& scope) const {
    SC_RETURN_IF_ERROR(CudaStatus(scope.status(), "cudaSetDevice"));
    if (comm_ != nullptr) return Status::Ok();
    return Status(Code::kFailedPrecondition, "the NCCL communicator was aborted after an earlier failure");
  }

  // Waits for the stream; an asynchronous NCCL error (a peer died) is reported, not waited on,
  // and a collective some rank never joins is aborted at the deadline.
  Status Finish() {
    const auto start = std::chrono::steady_clock::now();
    // The MPI collectives' deadline: NCCL would wait forever for a rank that never joins.
    const double timeout = CollectiveDeadline::FromEnvironment().timeout_s;
    while (true) {
      cudaError_t query = cudaStreamQuery(stream_);
      if (query == cudaSuccess) return Status::Ok();
      if (query != cudaErrorNotReady) return CudaStatus(query, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      SC_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return NcclStatus(async, "NCCL collective");
      }
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout > 0 && waited > timeout) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return Status(Code::kDeadlineExceeded,
                      "NCCL collective on rank " + std::to_string(rank()) + " gave up after " +
                          std::to_string(static_cast<int>(waited)) +
                          " s (SHARDCKPT_COLLECTIVE_TIMEOUT_S): a rank never joined it; the communicator is aborted");
      }
    }
  }

  Communicator& bootstrap_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device) {
  auto comm = std::make_unique<NcclCommunicator>(bootstrap, device);
  Status status = comm->Init();
  SC_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, status));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace shardckpt
