// Async save (docs/architecture.md): a short blocking snapshot, then a background persist.
//
//   auto saver = AsyncSaver::Create(*comm).value();
//   ...
//   auto handle = saver->Save(root, step, state).value();  // returns after the copy
//   // the training loop may change its tensors now
//   ...
//   Status s = handle->Wait();                              // same Status on every rank
//
// Snapshot: every piece is copied into one page-aligned staging area (pieces at 4096-aligned
// offsets, zero up to the next one), owned by the saver and reused by every later save; blobs are
// copied into the snapshot state. Persist: a background thread runs the ordinary collective Save
// on a duplicate of the communicator, writing every piece, tail included, straight from the
// staging area with O_DIRECT (no second copy); blobs and the checksum table go through a small
// ring of buffers that the saver also keeps. So no save after the first allocates or page-faults
// staging memory. The saver also keeps the save plan (save_plan_cache.h): a save of the same
// layout as the one before skips the gather and planning. One persist is in flight at a time;
// Save waits for the previous one.
//
// Copy while training (StartSave + Fence): parameters and optimizer state do not change until
// the optimizer step, so the snapshot copy can run while the forward and backward passes do.
// StartSave returns at once and copies in the background; the loop calls Fence() right before
// the optimizer step and blocks only if the copy is not done yet:
//
//   auto handle = saver->StartSave(root, step, state).value();  // returns before the copy
//   loss = forward(batch); backward(loss);                      // reads the tensors only
//   SC_RETURN_IF_ERROR(saver->Fence());                         // the copy is done
//   optimizer.step();                                           // may change them now
//
// MPI: the persist thread calls MPI while the training thread may too, so the communicator must
// be thread-safe (MPI_THREAD_MULTIPLE); Create says so plainly when it is not.
#pragma once

#include <future>
#include <memory>
#include <string>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"

namespace shardckpt {

class SaveHandle {
 public:
  // Waits for the persist and returns its status (the same on every rank). Callable many times.
  Status Wait();
  bool Done() const;
  int64_t step() const { return step_; }

 private:
  friend class AsyncSaver;
  std::shared_future<Result<SaveResult>> result_;
  int64_t step_ = 0;
};

class AsyncSaver {
 public:
  static Result<std::unique_ptr<AsyncSaver>> Create(Communicator& comm, SaveOptions options = {});
  ~AsyncSaver();

  // `metrics` are recorded in this save's manifest (SaveOptions::metrics of Create otherwise).
  Result<std::shared_ptr<SaveHandle>> Save(const std::string& root, int64_t step, const ShardedState& state,
                                           const std::map<std::string, double>& metrics = {});
  // Copy while training: starts the snapshot copy of `state` on a background thread and returns
  // without waiting for it. Until Fence() returns, the caller must not change the tensors (or
  // blobs) `state` points to, nor destroy `state`; reading them is fine. The persist follows the
  // copy in the background, as with Save. A previous persist still running is waited for first.
  // Failures, a background thread that cannot be started included, are reported by Fence (and
  // the handle) on every rank, never by StartSave on one rank alone.
  Result<std::shared_ptr<SaveHandle>> StartSave(const std::string& root, int64_t step, const ShardedState& state,
                                                const std::map<std::string, double>& metrics = {});
  // Waits until the snapshot copy of the last StartSave is done (at once when none is pending)
  // and returns its status, the same on every rank: after an error no persist runs for it.
  Status Fence();
  // Waits for the persist in flight, if any.
  Status Wait();
  // The retention policy, user metadata and state paths of the saves from now on (Create's options give the
  // first): a job that keeps the best checkpoints only on evaluation steps changes them between
  // saves and keeps one saver, one staging area. A save already started keeps its own. Call it
  // between saves, from the thread that calls Save and StartSave.
  void SetRetentionAndMetadata(const SaveOptions& from);

  uint64_t staging_bytes() const { return staging_.size(); }
  // Page-aligned buffers the saver allocated: its staging area and its ring, each buffer counted.
  uint64_t staging_allocations() const { return allocations_; }
  // After StartSave, read it only once Fence has returned (the copy's thread sets it).
  double last_snapshot_seconds() const { return last_snapshot_seconds_; }
  // How long the last Fence() blocked: the part of a StartSave's copy the loop waited for.
  double last_fence_seconds() const { return last_fence_seconds_; }
  // Saves that planned and that reused the kept plan (the caller's cache when it gave one).
  const SavePlanCache& plan_cache() const { return *options_.plan_cache; }

 private:
  AsyncSaver() = default;
  // Copies `state` into the staging area; this rank's result only (Save agrees on it).
  Status Snapshot(const ShardedState& state);
  std::unique_ptr<Communicator> comm_;
  SaveOptions options_;
  AlignedBuffer staging_;
  std::unique_ptr<BufferPool> ring_;  // the persist's buffers for blobs and the checksum table
  bool staging_pinned_ = false;  // pinned once a state with device pieces was snapshotted
  uint64_t allocations_ = 0;
  SavePlanCache own_plan_cache_;
  ShardedState snapshot_;
  std::shared_ptr<SaveHandle> in_flight_;
  double last_snapshot_seconds_ = 0;
  double last_fence_seconds_ = 0;
  std::shared_future<Status> snapshot_taken_;  // StartSave's copy, until Fence
};

}  // namespace shardckpt
