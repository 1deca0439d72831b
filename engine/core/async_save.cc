#include "shardckpt/engine/core/async_save.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"

namespace shardckpt {

Status SaveHandle::Wait() { return result_.get().status(); }

bool SaveHandle::Done() const {
  return result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

Result<std::unique_ptr<AsyncSaver>> AsyncSaver::Create(Communicator& comm, SaveOptions options) {
  if (!comm.thread_safe()) {
    return FailedPrecondition(std::string("async save needs a thread-safe communicator: the ") + comm.name() +
                              " library did not grant MPI_THREAD_MULTIPLE (ask for it in MPI_Init_thread; "
                              "MpiSession does), so the persist thread cannot run collectives beside the training thread");
  }
  std::unique_ptr<AsyncSaver> saver(new AsyncSaver());
  SC_ASSIGN_OR_RETURN(saver->comm_, comm.Duplicate());
  saver->options_ = options;
  saver->options_.always_stage = false;  // the staging area is aligned and padded: write straight from it
  saver->options_.pieces_padded = true;
  if (saver->options_.plan_cache == nullptr) saver->options_.plan_cache = &saver->own_plan_cache_;
  return saver;
}

AsyncSaver::~AsyncSaver() { Wait().IgnoreError(); }

Status AsyncSaver::Wait() {
  snapshot_taken_ = {};  // the persist comes after the copy: the copy is done too
  if (!in_flight_) return Status::Ok();
  Status status = in_flight_->Wait();
  in_flight_.reset();
  return status;
}

Status AsyncSaver::Snapshot(const ShardedState& state) {
  SC_RETURN_IF_ERROR(Failpoint("async.snapshot", "snapshot of this rank's state"));
  uint64_t needed = 0;
  for (const TensorPiece& p : state.pieces()) needed += AlignUp(static_cast<uint64_t>(p.bytes), kBlockSize);
  const bool want_pinned = state.has_device_pieces();
  if (needed > staging_.size() || (want_pinned && !staging_pinned_)) {
    staging_ = AlignedBuffer();  // release before allocating: staging can be most of host memory
    SC_ASSIGN_OR_RETURN(staging_, AlignedBuffer::Allocate(needed + needed / 8, StagingHostAllocator(want_pinned)));
    staging_pinned_ = want_pinned;
    allocations_++;
  }
  if (options_.staging == nullptr) {  // the caller's own ring, when given, is reused as it is
    SC_ASSIGN_OR_RETURN(ring_, BufferPool::Create(options_.staging_buffers, options_.staging_buffer_bytes));
    allocations_ += ring_->count();
    options_.staging = ring_.get();
  }
  snapshot_.Clear();
  uint64_t at = 0;
  std::vector<DeviceCopier*> copiers;  // device pieces' copies, all waited for before returning
  for (const TensorPiece& p : state.pieces()) {
    at = AlignUp(at, kBlockSize);
    if (p.bytes > 0 && p.space == MemorySpace::kCuda) {
      Result<DeviceCopier*> copier = CudaCopier(p.device);
      if (!copier.ok()) return copier.status().WithContext("tensor '" + p.name + "'");
      if (std::find(copiers.begin(), copiers.end(), *copier) == copiers.end()) {
        SC_RETURN_IF_ERROR((*copier)->WaitForDeviceWork());
        copiers.push_back(*copier);
      }
      SC_RETURN_IF_ERROR((*copier)->CopyToHostAsync(staging_.data() + at, p.data, static_cast<size_t>(p.bytes), 0));
    } else if (p.bytes > 0) {
      std::memcpy(staging_.data() + at, p.data, static_cast<size_t>(p.bytes));
    }
    // The writer writes the piece's last block whole, from here: its padding must be zero.
    const uint64_t pad = AlignUp(static_cast<uint64_t>(p.bytes), kBlockSize) - static_cast<uint64_t>(p.bytes);
    if (pad > 0) std::memset(staging_.data() + at + p.bytes, 0, pad);
    SC_RETURN_IF_ERROR(snapshot_.AddTensor(p.name, p.dtype, p.global_shape, p.layout, staging_.data() + at));
    at += static_cast<uint64_t>(p.bytes);
  }
  // The snapshot is the point after which training may change its tensors, device ones too.
  for (DeviceCopier* copier : copiers) SC_RETURN_IF_ERROR(copier->Synchronize());
  for (const BlobItem& b : state.blobs()) SC_RETURN_IF_ERROR(snapshot_.AddBlob(b.name, b.bytes, b.scope));
  return Status::Ok();
}

Result<std::shared_ptr<SaveHandle>> AsyncSaver::Save(const std::string& root, int64_t step, const ShardedState& state,
                                                     const std::map<std::string, double>& metrics) {
  // The previous persist still reads the staging area: finish it first. Its error belongs to
  // its own handle; this save goes ahead.
  Wait().IgnoreError();
  auto start = std::chrono::steady_clock::now();
  // Every rank learns whether every snapshot succeeded before any starts a persist: a rank that
  // failed alone would leave the others' background threads in the save's collectives.
  Status taken = Snapshot(state);
  if (!taken.ok()) taken = taken.WithContext("snapshot of step " + std::to_string(step));
  SC_RETURN_IF_ERROR(AgreeOnStatus(*comm_, taken));
  last_snapshot_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  auto handle = std::make_shared<SaveHandle>();
  handle->step_ = step;
  Communicator* comm = comm_.get();
  const ShardedState* snapshot = &snapshot_;
  SaveOptions options = options_;
  if (!metrics.empty()) options.metrics = metrics;
  handle->result_ = std::async(std::launch::async, [comm, root, step, snapshot, options]() {
                      return shardckpt::Save(*comm, root, step, *snapshot, options);
                    }).share();
  in_flight_ = handle;
  return handle;
}

Result<std::shared_ptr<SaveHandle>> AsyncSaver::StartSave(const std::string& root, int64_t step,
                                                          const ShardedState& state,
                                                          const std::map<std::string, double>& metrics) {
  Wait().IgnoreError();  // as in Save: the previous persist reads the staging area
  auto handle = std::make_shared<SaveHandle>();
  handle->step_ = step;
  auto taken = std::make_shared<std::promise<Status>>();
  snapshot_taken_ = taken->get_future().share();
  Communicator* comm = comm_.get();
  const ShardedState* caller = &state;
  SaveOptions options = options_;
  if (!metrics.empty()) options.metrics = metrics;
  // Only this thread touches the staging area, ring and snapshot until Wait: every later call
  // that could (Save, StartSave) waits for the persist first.
  handle->result_ = std::async(std::launch::async, [this, comm, root, step, caller, options, taken]() -> Result<SaveResult> {
                      auto start = std::chrono::steady_clock::now();
                      Status status = Snapshot(*caller);
                      if (!status.ok()) status = status.WithContext("snapshot of step " + std::to_string(step));
                      status = AgreeOnStatus(*comm, status);
                      last_snapshot_seconds_ =
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                      taken->set_value(status);
                      if (!status.ok()) return status;
                      return shardckpt::Save(*comm, root, step, snapshot_, options);
                    }).share();
  in_flight_ = handle;
  return handle;
}

Status AsyncSaver::Fence() {
  last_fence_seconds_ = 0;
  if (!snapshot_taken_.valid()) return Status::Ok();
  auto start = std::chrono::steady_clock::now();
  Status status = snapshot_taken_.get();
  last_fence_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  snapshot_taken_ = {};
  return status;
}

}  // namespace shardckpt
