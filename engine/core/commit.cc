#include "shardckpt/engine/core/commit.h"

#include <chrono>
#include <ctime>
#include <functional>
#include <future>
#include <system_error>
#include <thread>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/version.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

CreationInfo MakeCreationInfo(int hosts, const std::string& torch_version, const std::string& git_commit,
                              const std::map<std::string, std::string>& user) {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return CreationInfo{buf, kVersion, torch_version, hosts, git_commit, user};
}

namespace {

// A root resolves to its newest checkpoint: an earlier step saved beside a later one would never
// be what loading the root reads, and `latest` would name it while a load read the other.
Status NewestIsNotLater(const std::string& root, int64_t step) {
  std::vector<std::pair<int64_t, std::string>> without_manifest;
  SC_ASSIGN_OR_RETURN(auto committed, ListCommitted(root, &without_manifest));
  if (!committed.empty() && committed.back().first > step) {
    return FailedPrecondition("step " + std::to_string(step) + " is earlier than " + committed.back().second +
                              ", the newest checkpoint in " + root + ", which loading the root reads: to go back to " +
                              "an earlier step, save into another root, or remove the later checkpoints first");
  }
  // A later checkpoint linked from somewhere that cannot be reached now is one all the same.
  if (const auto [name, why] = UnreachableNewerThan(root, without_manifest, step); !name.empty()) {
    return FailedPrecondition("step " + std::to_string(step) + " is earlier than " + name + " in " + root + ", which is " +
                              why + ": bring it back, or save into another root");
  }
  return Status::Ok();
}

}  // namespace

Result<RootLock> LockRootForSave(const std::string& root, int64_t step) {
  // An empty root took the working directory's name ("" + "/.shardckpt.lock"): its lock file was
  // made there before the save failed on "opendir ".
  SC_RETURN_IF_ERROR(RefuseEmptyRoot(root));
  SC_RETURN_IF_ERROR(RefuseCheckpointAsRoot(root, "write checkpoints into"));
  SC_RETURN_IF_ERROR(RefuseOutputInCheckpoints(root));
  SC_RETURN_IF_ERROR(PersistReservation::CheckNotReserved(root));
  SC_RETURN_IF_ERROR(MakeDirs(root));
  SC_ASSIGN_OR_RETURN(RootLock lock, RootLock::Acquire(root));
  std::vector<RemovalFailure> not_removed;
  SC_RETURN_IF_ERROR(RemoveStaleTempDirs(root, nullptr, nullptr, &not_removed));
  SC_RETURN_IF_ERROR(RepairLatest(root));
  const std::string final_dir = JoinPath(root, StepDirName(step));
  for (const RemovalFailure& f : not_removed) {
    // Other leftovers are passed over; one in the way of this step's folder is not "committed".
    if (f.name == StepDirName(step)) {
      if (f.on_purpose) return FailedPrecondition(f.status.message() + "; it is in the way of step " + std::to_string(step) + "'s folder");
      return f.status.WithContext(final_dir + " is left from an earlier save of step " + std::to_string(step) +
                                  " (it has no manifest) and could not be removed");
    }
  }
  if (PathExists(final_dir)) {
    return Status(Code::kAlreadyExists, "step " + std::to_string(step) + " is already committed in " + final_dir);
  }
  SC_RETURN_IF_ERROR(NewestIsNotLater(root, step));
  return lock;
}

Status CheckNoLaterStep(const std::string& root, int64_t step) {
  if (!IsDirectory(root)) return Status::Ok();
  SC_RETURN_IF_ERROR(RefuseCheckpointAsRoot(root, "write checkpoints into"));
  return NewestIsNotLater(root, step);
}

Status BuiltManifestError(const Status& status) {
  if (status.code() != Code::kDataLoss) return status;
  return Internal("the manifest built for this checkpoint is invalid (a bug): " + status.message());
}

Status CheckBuiltManifest(const Manifest& manifest) {
  SC_RETURN_IF_ERROR(ValidateMetrics(manifest.metrics));
  return BuiltManifestError(ValidateManifest(manifest));
}

Status CheckBuiltManifestWhile(const Manifest& manifest, const std::function<Status()>& encode) {
  // Below this a thread's start costs more than it saves.
  constexpr size_t kChunksWorthAThread = 16384;
  size_t chunks = 0;
  for (const EntryRecord& e : manifest.entries) chunks += e.chunks.size();
  std::future<Status> checked;
  if (chunks >= kChunksWorthAThread && std::thread::hardware_concurrency() > 1) {
    try {
      checked = std::async(std::launch::async, [&manifest] { return CheckBuiltManifest(manifest); });
    } catch (const std::system_error&) {  // no thread to be had (a pids limit): in turn below
    }
  }
  if (!checked.valid()) {
    SC_RETURN_IF_ERROR(CheckBuiltManifest(manifest));
    return encode();
  }
  Status encoded = encode();
  SC_RETURN_IF_ERROR(checked.get());
  return encoded;
}

namespace {

// Runs `work` on a thread of its own, or in line when no thread can be had (a pids limit): the
// commit's fsyncs that can wait on the device together.
std::future<Status> Beside(std::function<Status()> work) {
  try {
    return std::async(std::launch::async, work);
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, std::move(work));
  }
}

}  // namespace

Status PublishCheckpoint(const std::string& root, const std::string& temp_name, int64_t step,
                         const std::vector<std::string_view>& manifest_text, std::optional<ManifestSummary> summary,
                         const RetentionPolicy& retention, AlignedBuffer* manifest_staging,
                         ManifestAhead* written_ahead) {
  const std::string temp_dir = JoinPath(root, temp_name);
  const std::string final_name = StepDirName(step);
  const std::string final_dir = JoinPath(root, final_name);
  const std::string latest = JoinPath(root, kLatestName);
  // `latest`'s new text is known now: its temp file is written and fsynced beside the manifest,
  // so that after the folder's rename only a rename and the root's fsync remain (about 1 ms of
  // a 33 ms save of 20,000 small tensors was that fsync, alone on the commit's path). A save that
  // fails before its rename removes it; a crash leaves `latest.tmp`, which the next save replaces.
  std::future<Status> latest_prepared = Beside([&] { return PrepareFileAtomic(latest, final_name + "\n", "commit.latest"); });
  // The manifest is written in place: the temp folder is not a checkpoint until it is renamed,
  // and a save that dies before that leaves it to the next save's cleanup. One fsync of the
  // folder makes the data files' names and the manifest's durable together. A manifest written
  // ahead was created with the data files, so every name is in the folder already and its fsync
  // runs beside the manifest's last write (0.2-2 ms here); otherwise it follows that write,
  // which creates the file.
  std::future<Status> folder_synced;
  if (written_ahead != nullptr) folder_synced = Beside([&] { return SyncDir(temp_dir, "commit.sync_tmp"); });
  Status written = written_ahead != nullptr
                       ? written_ahead->Complete(manifest_text.at(0), manifest_text.at(1), manifest_text.at(2))
                       : WriteFileDurably(JoinPath(temp_dir, kManifestName), manifest_text, manifest_staging,
                                          "commit.manifest");
  // (get() leaves the future invalid: which way the folder was synced is decided before it.)
  if (folder_synced.valid()) {
    Status synced = folder_synced.get();
    if (written.ok()) written = synced;
  } else if (written.ok()) {
    written = SyncDir(temp_dir, "commit.sync_tmp");
  }
  // A prepare that has not started (no thread was had) is not started for a commit that failed.
  const bool prepare_ran = latest_prepared.wait_for(std::chrono::seconds(0)) != std::future_status::deferred;
  if (written.ok() || prepare_ran) {
    Status prepared = latest_prepared.get();
    if (written.ok()) written = prepared;
  }
  if (written.ok()) written = Rename(temp_dir, final_dir, "commit.rename_dir");
  if (!written.ok()) {
    DiscardPreparedFile(latest);  // the root is locked: a latest.tmp there is this save's, if any
    return written;
  }
  Status status = SyncDir(root, "commit.sync_root");
  if (status.ok()) {
    status = PublishPreparedFile(latest, "commit.latest");
  } else {
    DiscardPreparedFile(latest);
  }
  if (!status.ok()) {
    if (ReadLatestName(root) == final_name) {
      // `latest` was renamed into place and only its fsync failed: the checkpoint is
      // published and readers use it, so the save stands (a retry would find it committed).
      SC_LOG(kWarn) << "save of " << final_dir << " stands, but a step after publishing it failed: " << status.ToString();
    } else {
      // Never published: remove it, manifest first, so nothing resolves to it.
      Result<bool> removed = RemoveCheckpointDir(root, final_name);
      if (!removed.ok() || !*removed) {
        SC_LOG(kWarn) << "could not remove " << final_dir << " after the failed commit ("
                      << (removed.ok() ? "a reader holds it" : removed.status().ToString())
                      << "); it is complete, and the next save of this root treats it as committed";
      }
      return status;
    }
  }
  if (summary.has_value()) RememberManifestSummary(final_dir, std::move(*summary));
  // The removed checkpoints' bytes are freed off the save's path; the next save waits for that.
  Result<RetentionReport> kept = ApplyRetention(root, retention, final_name, /*dry_run=*/false, Removal::kInBackground);
  if (!kept.ok()) SC_LOG(kWarn) << "retention after " << final_name << " failed (the save stands): " << kept.status().ToString();
  if (kept.ok()) {
    for (const RemovalFailure& f : kept->failed) {
      if (f.on_purpose) continue;  // kept by design, and logged so by retention
      SC_LOG(kWarn) << "retention after " << final_name << " could not remove " << JoinPath(root, f.name) << " ("
                    << f.status.ToString() << "); the save stands, and the next save tries again";
    }
  }
  return Status::Ok();
}

}  // namespace shardckpt
