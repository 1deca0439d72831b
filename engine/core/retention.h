// Which checkpoints of a root to keep: the newest K, united with the best K by one recorded
// metric, never the one `latest` names or the newest committed one. Used by every save (on rank
// 0, root lock held) and by `shardckpt prune` and `shardckpt list`.
//
// Why a reader never loses a checkpoint it opened: readers hold a shared flock on the folder
// (HoldCheckpoint), and deletion (RemoveCheckpointDir) takes the exclusive lock without waiting;
// a held folder is left for a later save. Deletion drops manifest.json first, so a crash in the
// middle leaves a folder that is not committed, which the next save removes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

struct RetentionPolicy {
  int keep_last = 0;            // the newest K committed checkpoints
  int keep_best = 0;            // the best K by `metric`; a checkpoint without it is never best
  std::string metric;           // a name in the manifest's "metrics"
  bool higher_is_better = false;  // mode max; default min (a loss)
  // Neither keep_last nor keep_best set: every checkpoint is kept.
  bool KeepsEverything() const { return keep_last <= 0 && keep_best <= 0; }
  // keep_best set: applying the policy reads every committed checkpoint's metrics.
  bool RanksByMetric() const { return keep_best > 0; }
};

// Refuses negative counts and keep_best without a metric name.
Status ValidatePolicy(const RetentionPolicy& policy);

// One folder under a root, as `list` shows it and the policy judges it.
struct CheckpointInfo {
  std::string name;
  int64_t step = -1;       // -1 for a folder whose name has no step
  bool committed = false;  // step-N with manifest.json
  bool temp = false;       // a save in progress, or left by one that died; or retired (.removing-*)
  bool symlink = false;
  std::string time;        // from the manifest
  int world_size = 0;
  uint64_t bytes = 0;      // files directly in the folder
  std::map<std::string, double> metrics;
  std::string problem;     // why the manifest could not be read, or why a folder is not committed
  // The manifest or a data file could not be read for a reason that is not damage (permission,
  // EIO, ESTALE on a network file system): not known to be damaged, so retention keeps it.
  bool unreadable = false;
  bool examined = false;   // its manifest (and data files' sizes) were read into the fields above
  std::string foreign;     // a step folder without manifest: a file in it no save writes, if any (left alone);
                           // `name` itself when the "folder" is a file
  std::string unreachable; // a step folder that cannot be reached (UnreachableStepFolder): why; left alone
  bool keep = false;       // what the policy decides, for committed checkpoints
  std::string why;         // "latest", "last 3", "best 2 by val_loss", ...
};

// When no checkpoint records any metric yet (a run saves before its first evaluation), keep_best
// could rank none even with its metric spelt right: a save applies the rest of the policy then,
// as the policy itself would; a person's `prune` is refused, as likely a mistake.
enum class MetricsNoneYet { kRefuse, kApplyTheRest };

// Pure: with keep_best, the policy's metric must be recorded by some checkpoint of `all`, else
// InvalidArgument naming the metrics recorded. A misspelt metric makes nothing best, so the
// policy would remove every checkpoint but the newest K, the best among them.
Status CheckMetricRecorded(const RetentionPolicy& policy, const std::string& root, const std::vector<CheckpointInfo>& all,
                           MetricsNoneYet none_yet = MetricsNoneYet::kRefuse);

// Pure: the folder a root resolves to (ResolveCheckpoint), from its listing: the newest committed
// one, which `latest` names unless a save stopped between its rename and `latest` (RepairLatest
// mends that); empty when there is none. Retention keeps this one, so a dry run plans as the
// real prune does.
std::string NewestCommitted(const std::vector<CheckpointInfo>& all);

// Pure: marks keep/why on every committed entry of `all` (others are left unkept). `latest` is
// the folder name `latest` holds; it and the newest committed checkpoint are always kept.
void PlanRetention(const RetentionPolicy& policy, const std::string& latest, std::vector<CheckpointInfo>* all);

// Every step folder under root (committed, temp, or left without a manifest), oldest first,
// with what the manifests record. `with_manifests` false skips reading them (faster; no metrics).
// `with_bytes` false leaves `bytes` 0 and stats only the data files a manifest names, not every
// file of every folder.
Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, bool with_manifests = true,
                                                    bool with_bytes = true);

struct RetentionReport {
  std::vector<std::string> removed;   // or, on a dry run, would be removed
  std::vector<std::string> deferred;  // held by a reader (on a dry run: now); a later save removes them
  std::vector<RemovalFailure> failed;  // could not be deleted: passed over, the rest still removed
};

// Applies `policy` to root; the caller holds the root lock. `just_committed` is never removed.
// Removes nothing, and fails, when keep_best's metric is recorded nowhere while others are
// (CheckMetricRecorded, kApplyTheRest): after a save, that is a warning and the save stands.
// dry_run: reports what would go and removes nothing. A save passes Removal::kInBackground: what
// it removes stops being a checkpoint before the call returns, and its bytes are freed on a
// helper thread (background_removal.h). A folder that cannot be deleted goes into `failed` (the
// caller reports it) and the others are still removed.
// `kept_for_latest` (prune on a full disk, where `latest` could not be rewritten yet): the folder
// `latest` names, examined and ranked as any other but not removed; it goes into `failed` as left
// on purpose, saying why.
Result<RetentionReport> ApplyRetention(const std::string& root, const RetentionPolicy& policy,
                                       const std::string& just_committed, bool dry_run = false,
                                       Removal when = Removal::kNow, const std::string& kept_for_latest = "");

}  // namespace shardckpt
