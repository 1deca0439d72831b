#include "shardckpt/engine/core/async_save.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <system_error>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"

namespace shardckpt {

Status SaveHandle::Wait() {
  // An exception escaping the persist thread (it should return a Status) is rethrown here; in
  // ~AsyncSaver that would terminate the process.
  try {
    return result_.get().status();
  } catch (const std::exception& e) {
    return Internal(std::string("the save of step ") + std::to_string(step_) + " failed with an exception: " + e.what());
  }
}

namespace {
// Lets go of a persist's root reservation when its thread's work ends, however it ends (an
// exception included): the std::async state keeps the functor, and with it any copy, for as long
// as the save's handle lives.
struct ReleaseWhenDone {
  std::shared_ptr<PersistReservation>& held;
  ~ReleaseWhenDone() { held.reset(); }
};

// The snapshot's own failures are Statuses; what it allocates (staging, the snapshot's pieces)
// can still throw std::bad_alloc, which must reach the agreement as an error like any other.
template <typename F>
Status Guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Internal("out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

// std::async throws std::system_error when no thread can be made (a pids limit); the failpoint
// async.thread stands for that in tests.
template <typename F>
Result<std::shared_future<Result<SaveResult>>> StartThread(F&& f) {
  if (Status injected = Failpoint("async.thread", "the save's thread"); !injected.ok()) {
    return Internal("cannot start the save's thread: " + injected.message());
  }
  try {
    return std::async(std::launch::async, std::forward<F>(f)).share();
  } catch (const std::system_error& e) {
    return Internal(std::string("cannot start the save's thread: ") + e.what());
  }
}
}  // namespace

bool SaveHandle::Done() const {
  // Deferred: a save whose thread never started; its outcome is known, and Wait only agrees on it.
  const std::future_status status = result_.wait_for(std::chrono::seconds(0));
  return status == std::future_status::ready || status == std::future_status::deferred;
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
  SC_RETURN_IF_ERROR(state.CheckNothingRefused());  // before any staging is allocated for it
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
  Status taken = Guarded([&] { return Snapshot(state); });
  if (!taken.ok()) taken = taken.WithContext("snapshot of step " + std::to_string(step));

  // The persist thread is started before the agreement and held until it: a rank that cannot
  // start one (a pids limit) fails the save on every rank, rather than leaving the others'
  // threads in the save's collectives until the deadline.
  auto go = std::make_shared<std::promise<bool>>();
  std::shared_future<bool> agreed_to_go = go->get_future().share();
  Communicator* comm = comm_.get();
  const ShardedState* snapshot = &snapshot_;
  SaveOptions options = options_;
  if (!metrics.empty()) options.metrics = metrics;
  // Absolute now: a chdir before the persist runs must not move the checkpoint (or its retention).
  const std::string where = AbsoluteRoot(root);
  if (taken.ok()) taken = PersistReservation::CheckNotReserved(where);  // another persist's root: refused on every rank
  auto reserved = std::make_shared<PersistReservation>(where);  // from now until the persist ends
  Result<std::shared_future<Result<SaveResult>>> thread =
      StartThread([comm, where, step, snapshot, options, agreed_to_go, reserved]() mutable -> Result<SaveResult> {
        ReleaseWhenDone release{reserved};
        reserved->OnPersistThread();
        if (!agreed_to_go.get()) return Status(Code::kAborted, "not started: the save was refused");
        SC_RETURN_IF_ERROR(Failpoint("async.persist_start", "the persist of step " + std::to_string(step)));
        return shardckpt::Save(*comm, where, step, *snapshot, options);
      });
  Status agreed = AgreeOnStatus(*comm_, taken.ok() ? thread.status() : taken);
  if (thread.ok()) go->set_value(agreed.ok());
  if (!agreed.ok()) {
    if (thread.ok()) thread->wait();
    return agreed;
  }
  last_snapshot_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto handle = std::make_shared<SaveHandle>();
  handle->step_ = step;
  handle->result_ = std::move(*thread);
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
  const std::string where = AbsoluteRoot(root);  // as in Save
  const Status free_root = PersistReservation::CheckNotReserved(where);
  auto reserved = std::make_shared<PersistReservation>(where);
  // Only this thread touches the staging area, ring and snapshot until Wait: every later call
  // that could (Save, StartSave) waits for the persist first.
  Result<std::shared_future<Result<SaveResult>>> started = StartThread([this, comm, where, step, caller, options, taken,
                                                                        reserved, free_root]() mutable -> Result<SaveResult> {
                      ReleaseWhenDone release{reserved};
                      reserved->OnPersistThread();
                      auto start = std::chrono::steady_clock::now();
                      Status status = free_root.ok() ? Guarded([&] { return Snapshot(*caller); }) : free_root;
                      if (!status.ok()) status = status.WithContext("snapshot of step " + std::to_string(step));
                      status = AgreeOnStatus(*comm, status);
                      last_snapshot_seconds_ =
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                      taken->set_value(status);
                      if (!status.ok()) return status;
                      SC_RETURN_IF_ERROR(Failpoint("async.persist_start", "the persist of step " + std::to_string(step)));
                      return shardckpt::Save(*comm, where, step, snapshot_, options);
                    });
  if (!started.ok()) {
    // The other ranks' threads agree on their snapshots: this rank's failure joins that agreement,
    // so that every rank's fence reports it, rather than the others waiting in it until the
    // collective deadline. Joined at this rank's Fence or Wait, not here: returning at once lets
    // this rank go on to its forward pass, whose collectives the others' snapshots may wait for
    // (a snapshot of device tensors synchronizes the device, queued NCCL kernels included).
    const Status failure = started.status().WithContext("snapshot of step " + std::to_string(step));
    std::shared_future<Status> agreed =
        std::async(std::launch::deferred, [comm, failure] { return AgreeOnStatus(*comm, failure); }).share();
    snapshot_taken_ = agreed;
    started = std::async(std::launch::deferred, [agreed]() -> Result<SaveResult> { return agreed.get(); }).share();
  }
  handle->result_ = std::move(*started);
  in_flight_ = handle;
  return handle;
}

void AsyncSaver::SetRetentionAndMetadata(const SaveOptions& from) {
  options_.keep_last = from.keep_last;
  options_.keep_best = from.keep_best;
  options_.best_metric = from.best_metric;
  options_.best_higher_is_better = from.best_higher_is_better;
  options_.user_metadata = from.user_metadata;
  options_.state_paths = from.state_paths;
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
