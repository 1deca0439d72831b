// The save plan kept across saves of the same layout (docs/architecture.md, save step 1).
//
// A training job saves the same pieces again and again; the gather of every rank's description
// and rank 0's planning (seconds for a million chunks) then decide nothing new. Give Save a
// SavePlanCache (SaveOptions::plan_cache; AsyncSaver keeps one) and a repeat save replaces them
// with one allreduce of five integers: every rank hashes its own description
// (DigestStateDescription: names, dtypes, shapes, layouts, blob sizes, and its host) and compares
// it with the one its kept plan was made from. The plan is reused only when no rank's description
// changed, every rank keeps the same plan (rank 0 gives each plan a random id) and every rank
// saves the same step, so all ranks decide alike; any change on any rank plans afresh on all.
// Rank 0 still takes the root lock, cleans the root and creates the temp folder every save.
#pragma once

#include <cstdint>
#include <memory>

#include "shardckpt/engine/core/save_phases.h"
#include "shardckpt/io/aligned_buffer.h"

namespace shardckpt {

struct SavePlanCache {
  // Counters for this rank: saves that planned (the gather ran) and saves that reused a plan.
  uint64_t plans_made = 0;
  uint64_t plans_reused = 0;
  // Rank 0: committed saves whose manifest body was written during the data phase (manifest_ahead.h).
  uint64_t manifests_written_early = 0;

  // Save's own state; callers only read it.
  int64_t plan_id = 0;  // 0: no plan kept
  uint64_t digest = 0;  // this rank's description when the plan was made
  int world = 0;
  std::shared_ptr<const SavePlan> plan;
  std::shared_ptr<const save_phases::Descriptions> described;  // rank 0 only
  // Rank 0: the last committed manifest of this plan, for a repeat save that places every piece
  // where it did (save_phases.h).
  std::shared_ptr<save_phases::KeptManifest> manifest;
  // Rank 0: the aligned memory its manifest is written from (PublishCheckpoint). Kept by Clear:
  // a new plan's manifest is about as large.
  AlignedBuffer manifest_staging;

  void Clear() {
    plan_id = 0;
    plan.reset();
    described.reset();
    manifest.reset();
  }
};

}  // namespace shardckpt
