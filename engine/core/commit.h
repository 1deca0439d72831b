// Commit of a checkpoint whose data files are written and synced in <root>/<temp_name>: steps 4
// to 9 of the protocol in save.h. Shared by the collective Save (on rank 0) and by the offline
// writer (import, reshard), each of which validates and encodes its manifest its own way.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/manifest_ahead.h"
#include "shardckpt/engine/core/manifest_summary.h"
#include "shardckpt/engine/core/retention.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/aligned_buffer.h"

namespace shardckpt {

// Opens root for a save of `step` (a job's or an offline writer's): refuses a checkpoint folder
// given for the root (RefuseCheckpointAsRoot) before anything is written into it, makes the
// root, takes its writer lock, removes what dead saves left (RemoveStaleTempDirs), repairs a
// stale `latest`, and refuses a step that is already committed (AlreadyExists) or earlier than
// the newest committed one (FailedPrecondition). The lock is the caller's to hold.
Result<RootLock> LockRootForSave(const std::string& root, int64_t step);
// LockRootForSave's checks of the root alone, without the lock (a checkpoint folder, a later
// step): a job resumed from an earlier step than its root's newest, or given a checkpoint folder
// for its root, learns it before training, not at its first save. A missing root is fine.
Status CheckNoLaterStep(const std::string& root, int64_t step);

// A manifest this process built is valid, or the error is a bug of ours (Internal), not a
// damaged file.
Status CheckBuiltManifest(const Manifest& manifest);
// ValidateManifest's refusal (DataLoss) of a manifest this process built, said as that bug;
// any other status as it is.
Status BuiltManifestError(const Status& status);
// CheckBuiltManifest and `encode` (which only reads `manifest`) together: on a second thread when
// the manifest is large and the machine has a spare core (a reshard to 64 ranks of 20,000 tensors
// validates 630,000 chunks while it encodes them), else one after the other. The check's error
// comes first: text encoded from an invalid manifest is never used.
Status CheckBuiltManifestWhile(const Manifest& manifest, const std::function<Status()>& encode);
// The commit once the manifest is validated and encoded: `manifest_text` is the manifest of
// `step`, already validated and encoded, in pieces written one after the other (a repeat save's
// kept entries between a new head and seal, save_phases.h). It is written with O_DIRECT through
// `manifest_staging` (WriteFileDurably), which a caller that saves again keeps; nullptr stages
// in memory of this call's own. `summary`, the manifest's (SummaryOf), is remembered once the
// checkpoint is published, so that later saves need not decode it: callers give it when
// `retention` ranks by a metric, the one reader of summaries, and build none otherwise.
// `written_ahead`, where given, began writing these three pieces (head, body, seal) to the temp
// folder's manifest and Fits them: the commit completes that file instead (manifest_ahead.h).
// Writes the manifest, renames the folder to step-N, fsyncs the root, replaces `latest` and
// applies retention. On failure before `latest` names the new folder, the folder is removed
// (manifest first). Once `latest` names it the save has succeeded: a later failure (the fsync
// after `latest`, retention) is logged as a warning, not returned.
Status PublishCheckpoint(const std::string& root, const std::string& temp_name, int64_t step,
                         const std::vector<std::string_view>& manifest_text, std::optional<ManifestSummary> summary,
                         const RetentionPolicy& retention, AlignedBuffer* manifest_staging = nullptr,
                         ManifestAhead* written_ahead = nullptr);

// The creation facts every manifest carries; `torch_version` and `git_commit` may be empty.
CreationInfo MakeCreationInfo(int hosts, const std::string& torch_version, const std::string& git_commit,
                              const std::map<std::string, std::string>& user);

}  // namespace shardckpt
