// The root folder's conventions (docs/format.md): step folder names, the `latest` pointer,
// save-in-progress folders, the writer lock, readers' holds and the one deletion routine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

inline constexpr const char* kLatestName = "latest";
inline constexpr const char* kLockName = ".shardckpt.lock";

std::string StepDirName(int64_t step);                        // step-000001000
std::string TempDirName(int64_t step, const std::string& id);  // step-000001000.tmp-<id>
bool IsTempDirName(const std::string& name);
// .removing-step-000001000-<id>: a checkpoint retired by retention whose files are being deleted
// in the background (background_removal.h); never committed, never listed as a checkpoint.
std::string RetiredDirName(const std::string& step_dir_name);
bool IsRetiredDirName(const std::string& name);
// The step a temp or retired folder name was made for; false for other names.
bool ParseLeftoverStepDirName(const std::string& name, int64_t* step);
std::string RankFileName(int rank);  // rank-00003.bin
std::string RandomId();              // 16 hex digits, for temp and retired folder names

// What "committed" means, for every path that reads or writes a root: a folder named step-N
// (no temp suffix) directly under the root that holds manifest.json. The manifest is written and
// synced before the folder gets that name, so such a folder is complete. `latest` is a hint:
// the newest committed folder wins when `latest` is stale (a crash between the rename of step-N
// and the replacement of `latest`), and the next save repairs it.
//
// A committed checkpoint folder is returned as is; a root resolves to its newest committed
// checkpoint. Anything else is NotFound with a message saying what was there.
Result<std::string> ResolveCheckpoint(const std::string& path);

// InvalidArgument for an empty root path (an unset variable): saves and the tools that take a
// root refuse it before anything is made in the working directory.
Status RefuseEmptyRoot(const std::string& root);

// Committed checkpoints under root as (step, folder name), oldest first.
Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(const std::string& root);
// The same, and the step folders of the same listing that hold no manifest (a commit or deletion
// cut short, or one that cannot be reached), sorted likewise.
Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(
    const std::string& root, std::vector<std::pair<int64_t, std::string>>* without_manifest);

// The folder name `latest` holds, trimmed; empty when there is no readable `latest`.
std::string ReadLatestName(const std::string& root);

// Parses "step-000001000" (no suffix); false for anything else.
bool ParseStepDirName(const std::string& name, int64_t* step);

// A reader's claim on a checkpoint: a shared flock on its folder, held while the reader reads.
// Deletion (RemoveCheckpointDir) tries an exclusive flock without waiting and leaves a held
// folder for a later save, so a checkpoint a reader resolved stays whole until it lets go.
class CheckpointHold {
 public:
  CheckpointHold() = default;
  CheckpointHold(CheckpointHold&& other) noexcept : dir_(std::move(other.dir_)), fd_(other.fd_) { other.fd_ = -1; }
  CheckpointHold& operator=(CheckpointHold&& other) noexcept;
  CheckpointHold(const CheckpointHold&) = delete;
  ~CheckpointHold();
  const std::string& dir() const { return dir_; }

 private:
  friend Result<CheckpointHold> HoldCheckpoint(const std::string& path);
  std::string dir_;
  int fd_ = -1;
};

// ResolveCheckpoint, then the shared lock. A root whose newest checkpoint is removed between
// the two is resolved again; a named checkpoint folder that is removed is NotFound saying so.
Result<CheckpointHold> HoldCheckpoint(const std::string& path);

// The one way anything under a root is deleted (retention, prune, cleanup of failed and dead
// saves). Removes manifest.json first and syncs the folder, so a crash halfway leaves a folder
// that is not committed (and that the next save removes); never follows a symlink (a linked
// folder or file loses the link, its target is untouched); never deletes outside root/name.
// Returns false, deleting nothing, when a reader holds the folder.
// kInBackground (retention after a save): once the manifest is gone and the folder synced, the
// folder is renamed to RetiredDirName and its files deleted on a helper thread
// (background_removal.h); the call returns without waiting for the filesystem to free them.
enum class Removal { kNow, kInBackground };
Result<bool> RemoveCheckpointDir(const std::string& root, const std::string& name, Removal when = Removal::kNow);

// Whether a reader holds root/name now (HoldCheckpoint's shared lock; through a symlink, on its
// target), so that RemoveCheckpointDir would leave it: what a dry run and a listing report.
bool HeldByReader(const std::string& root, const std::string& name);

// A folder a removal could not delete (permissions, an immutable file, a busy NFS file), and why;
// or, `on_purpose`, one it left because it holds files no save writes (someone's own): named, but
// no failure of the removal (a prune that meets one still succeeds).
struct RemovalFailure {
  std::string name;
  Status status;
  bool on_purpose = false;
};


// The first entry in step folder `dir` that no save writes there (a save writes rank files and
// the manifest; NFS's .nfsXXXX files are not counted), or "" when there is none or `dir` cannot
// be listed. A step folder without a manifest is a cut-short commit's or deletion's leftover,
// deleted by the next save, only while it holds nothing else: someone's own files in it (notes,
// an evaluation's output) are left with it for a person to move. (A deletion cut short of a
// committed folder that held such files leaves it so too.)
std::string FirstEntryNoSaveWrites(const std::string& dir);
// Why step folder `dir`, though something stands in its place, has no manifest to be read: a
// link to a folder that cannot be reached now (an archive not mounted), or a manifest.json that
// is a link to nothing. No save leaves either, so the cleanup leaves them, `list` names them,
// and a root whose newest step folder is one is refused rather than read at an older step.
// "" for anything else.
std::string UnreachableStepFolder(const std::string& dir);
// The first case of it alone, for a path a user names (a root, a checkpoint folder): "a link to
// T, which cannot be reached (errno text)" when `path` (trailing slashes ignored) is a link that
// cannot be followed now, else "".
std::string UnreachableLink(const std::string& path);
// The step folder of `without_manifest` (from ListCommitted) newer than `step` that cannot be
// reached (UnreachableStepFolder), as {name, why}; empty strings when there is none.
std::pair<std::string, std::string> UnreachableNewerThan(
    const std::string& root, const std::vector<std::pair<int64_t, std::string>>& without_manifest, int64_t step);
// Whether `root` holds a checkpoint: a committed step folder, or one that cannot be reached now
// (someone's checkpoint elsewhere, which a new run must not be mixed with). False for a root that
// cannot be listed (none yet).
bool HoldsCheckpoints(const std::string& root);
// The same, with the listing's error where the root cannot be listed (a permission, EIO, ESTALE):
// for a caller that must not take such a root for an empty one.
Result<bool> ListHoldsCheckpoints(const std::string& root);
// Why root/name, such a folder (`why` from UnreachableStepFolder), is left: as the cleanup
// reports it, and `list` and a dry run say it.
Status LeftUnreachable(const std::string& root, const std::string& name, const std::string& why);
// Why root/name, a step folder without a manifest holding `foreign`, is left: as the cleanup
// reports it and a dry run of it says so. `foreign` == `name`: root/name is itself a file, not a
// folder (a save writes folders only).
Status LeftForItsFiles(const std::string& root, const std::string& name, const std::string& foreign);
// The refusal a save of a step `planned` picks would meet at its commit, for the first such
// step folder in `root` that the cleanup leaves in its place (someone's files, a file, a link
// that cannot be reached); OK when there is none. A job that knows its save steps checks them
// before training, not when it reaches that step (the work since the last save lost).
Status CheckPlannedStepFolders(const std::string& root, const std::function<bool(int64_t)>& planned);

// Removes what crashed or failed saves left: temp folders, step folders without a manifest
// (a deletion cut short; one holding files no save writes is passed over and put in `failed`)
// and retired folders whose background deletion did not finish. Waits
// first for this process's own background deletions. Called with the root lock held. Where
// given, `removed` and `left` get the names removed and those left (held by a reader, or a
// retired folder another process is removing). A folder that cannot be deleted is logged, put
// in `failed`, and passed over: one undeletable leftover must not fail every later save.
Status RemoveStaleTempDirs(const std::string& root, std::vector<std::string>* removed = nullptr,
                           std::vector<std::string>* left = nullptr, std::vector<RemovalFailure>* failed = nullptr);

// A root given that is itself a checkpoint (a step folder, or a DCP folder): InvalidArgument
// "<root> is a checkpoint, not a root: <verb> the folder that holds its step folders" (for a DCP
// folder, which has none, "<verb> a folder of shardckpt step folders, or a new one"). Saving
// into one nested new checkpoints inside it, which loading it never reads.
Status RefuseCheckpointAsRoot(const std::string& root, const std::string& verb);

// An output file (consolidate's, an export's folder) that would land inside the checkpoint
// folder being read, inside any other committed checkpoint folder, or replace a root's `latest`:
// InvalidArgument. Written there, it could replace one of a checkpoint's own files (its manifest:
// the checkpoint no longer loads) or the pointer every resume reads, and retention would delete
// it with the checkpoint. Links are resolved on both sides.
Status RefuseOutputInCheckpoint(const std::string& out, const std::string& checkpoint_dir);
// The same without a checkpoint being read: `out` (a file, or a root a save, import or reshard
// writes) inside no committed checkpoint folder, named as no root's checkpoint folders, and no
// root's `latest`. A root made inside a step folder was deleted with it by the next retention.
Status RefuseOutputInCheckpoints(const std::string& out);

// Refuses a folder at root/latest (someone's mkdir), where saves keep the file naming the newest
// checkpoint: the save's last step, the rename of latest.tmp over it, would fail after all its
// bytes were written. Checked by RepairLatest (every save and prune), prune --dry-run and the
// trainers before they train. A link there, even to a folder, is replaced like a file.
Status CheckLatestIsNoFolder(const std::string& root);
// Rewrites `latest` when it does not name the newest committed checkpoint. Root lock held.
Status RepairLatest(const std::string& root);

// An exclusive flock on <root>/.shardckpt.lock, held by rank 0 for the length of a save, so two
// jobs saving into one root cannot interleave: the second fails at once with a clear error.
// A prune (`shardckpt prune`, run by an operator on a live root) also holds .shardckpt.prune.lock
// while it holds the root lock; a save that finds the root lock taken by a prune waits for it
// (a prune is short) instead of failing the training run.
inline constexpr const char* kPruneLockName = ".shardckpt.prune.lock";
class RootLock {
 public:
  // Waits while a prune holds the root (it removes a few folders and lets go), saying so after a
  // second; gives up after 10 minutes, or half the collective deadline when that is shorter (the
  // other ranks of a save wait for this one in a collective, and would blame it).
  static Result<RootLock> Acquire(const std::string& root);
  // Never waits: a save or another prune holding the root is FailedPrecondition.
  static Result<RootLock> AcquireForPrune(const std::string& root);
  // Whether a save or prune holds root now; creates no lock file (a dry run writes nothing).
  static bool Held(const std::string& root);
  RootLock(RootLock&& other) noexcept : fd_(other.fd_), prune_fd_(other.prune_fd_), waited_s_(other.waited_s_) {
    other.fd_ = other.prune_fd_ = -1;
  }
  RootLock& operator=(RootLock&&) = delete;
  RootLock(const RootLock&) = delete;
  ~RootLock();
  // Seconds Acquire waited for a prune to let go (a save books them as a phase of their own).
  double waited_s() const { return waited_s_; }

 private:
  RootLock(int fd, int prune_fd);  // records the lock as this process's
  int fd_ = -1;
  int prune_fd_ = -1;
  double waited_s_ = 0;
};

// A root an async save of this process writes into, from the moment the save is started (its
// persist takes the root lock later, on its own thread) until the persist ends. Another save
// into it meanwhile fails, and it is that other save that fails, never the async one, whatever
// the two threads' timing. Keyed by the absolute path (AbsoluteRoot).
class PersistReservation {
 public:
  explicit PersistReservation(std::string absolute_root);
  PersistReservation(const PersistReservation&) = delete;
  PersistReservation& operator=(const PersistReservation&) = delete;
  ~PersistReservation();
  // Marks the calling thread as this reservation's persist: its own save passes it.
  void OnPersistThread() const;
  // FailedPrecondition where a persist of this process holds `root`, other than the calling
  // thread's own. Called by each save as it locks the root, and by an async save as it starts
  // (before it reserves), so a second async save into the root is the one refused too.
  static Status CheckNotReserved(const std::string& root);

 private:
  std::string root_;
};

// `root` made absolute against the working directory now (a relative root handed to a
// background thread must not follow a later chdir); `root` itself where that fails.
std::string AbsoluteRoot(const std::string& root);

}  // namespace shardckpt
