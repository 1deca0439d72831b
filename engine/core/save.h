// Collective save (docs/architecture.md). Every rank of `comm` calls Save with its own state.
// step-N below is the step folder's name, the step written in nine digits: step-000000010.
//
// Commit protocol, in order; a crash or error at any step leaves `latest` on the previous
// checkpoint, which stays loadable:
//   1. rank 0 takes the root lock, removes folders of saves that died, gathers every rank's
//      description, plans who writes what, creates <root>/step-N.tmp-<id>/, and broadcasts the
//      plan (or its error). A rank that cannot decode the plan reports that in step 3
//      [save.decode_plan]. With SaveOptions::plan_cache, a save whose descriptions did not change
//      on any rank skips the gather and planning (save_plan_cache.h).
//   2. every rank writes rank-RRRRR.bin into the temp folder (O_DIRECT, io_uring) and fdatasyncs it
//      [failpoints save.write_data, io.write, io.fsync].
//   3. rank 0 gathers the chunk records and each rank's status; if any failed, it removes the
//      temp folder and every rank returns the same error naming the failing ranks.
//   4. rank 0 writes manifest.json into the temp folder (O_DIRECT where the file system takes
//      it) and fdatasyncs it
//                                                          [commit.manifest.write, .fsync]
//      and, on a thread beside it, writes and fsyncs latest.tmp, naming step-N
//                                                          [commit.latest.write, .fsync]
//   5. fsyncs the temp folder: the data files' and the manifest's names [commit.sync_tmp]
//      (beside step 4 when the manifest was written ahead, its file made with the data files)
//   6. renames the folder to step-N                         [commit.rename_dir]
//   7. fsyncs the root                                      [commit.sync_root]
//   8. renames latest.tmp over `latest`, fsyncs the root     [commit.latest.rename, .sync_dir]
//   9. applies retention (keep_last, keep_best); a failure here is logged, the save stands.
// If a step from 6 on fails, the new folder is removed (manifest first) unless `latest` already
// names it; once `latest` names it the save has succeeded, whatever fails after.
// A crash between 6 and 8 leaves step-N committed and `latest` stale: readers resolve a root to
// its newest committed folder, and the next save repairs `latest` (checkpoint_dir.h).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/phase_times.h"
#include "shardckpt/engine/core/retention.h"
#include "shardckpt/engine/model/state.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {

struct SavePlanCache;  // save_plan_cache.h

struct SaveOptions {
  // Retention (retention.h): the newest keep_last united with the best keep_best by
  // `best_metric`; both 0 keep every checkpoint. `latest` is never removed.
  int keep_last = 0;
  int keep_best = 0;
  std::string best_metric;
  bool best_higher_is_better = false;
  RetentionPolicy retention() const { return RetentionPolicy{keep_last, keep_best, best_metric, best_higher_is_better}; }
  // Recorded in the manifest's "metrics" (finite numbers), for keep_best and for people.
  std::map<std::string, double> metrics;
  IoOptions io;
  size_t staging_buffers = 8;
  size_t staging_buffer_bytes = 8u << 20;
  // Copy every byte through the staging ring (async saves need it; sync saves write aligned
  // tensors straight from their memory).
  bool always_stage = false;
  std::map<std::string, std::string> user_metadata;
  // Where each nested leaf of the state sat (the Python package's save: a JSON object of paths,
  // engine/formats/state_tree.h), recorded as user_metadata["torch_paths"] unless that key is
  // given, so that a consolidated .pt has the state's nesting. Rank 0's is recorded; unlike
  // user_metadata the ranks need not pass the same (their states may name different leaves).
  std::string state_paths;
  std::string torch_version;
  std::string git_commit;
  // Staging memory to reuse across saves; when null, the process's spare staging pool is used
  // (engine/core/staging_cache.h), or with keep_staging false one is made for this save alone.
  BufferPool* staging = nullptr;
  bool keep_staging = true;
  // Every piece starts on a page and its memory is readable and zero up to the next page
  // boundary (AsyncSaver's snapshot): pieces are written in place, tails too, never copied.
  bool pieces_padded = false;
  // Keeps the plan for the next save of the same layout (save_plan_cache.h); every rank passes
  // its own cache, or none does. Null: every save gathers and plans.
  SavePlanCache* plan_cache = nullptr;
  // Chunks under 1 MiB packed at their element size (format 1.1, engine/model/chunk_packing.h);
  // false puts every chunk on a 4096-byte block, the 1.0 layout older shardckpt reads.
  bool pack_small_chunks = true;
};

struct SaveResult {
  std::string path;            // the committed folder
  int64_t bytes_written = 0;   // by this rank, data and padding and table
  int64_t total_bytes = 0;     // by all ranks
  // This rank's time in each phase, in order: plan, write, gather_reports, then on rank 0
  // build_manifest (or the refresh of the kept one) and commit (validate, encode, write and
  // publish the manifest, apply retention), and share_outcome (on other ranks: waiting for rank
  // 0's commit).
  std::vector<PhaseTime> phases;
};

// Steps are non-negative: a negative one would make a folder no listing, load or cleanup sees.
Status ValidateStep(int64_t step);

Result<SaveResult> Save(Communicator& comm, const std::string& root, int64_t step,
                        const ShardedState& state, const SaveOptions& options = {});

}  // namespace shardckpt
