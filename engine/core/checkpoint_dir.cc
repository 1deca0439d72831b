#include "shardckpt/engine/core/checkpoint_dir.h"

#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/model_file_kind.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/background_removal.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

bool ParseStepDirName(const std::string& name, int64_t* step) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return false;
  int64_t value = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    // Every step Save takes reads back, up to INT64_MAX itself (the guard used to refuse the
    // last eight, whose folders a save made and no listing, load or prune then saw).
    if (name[i] < '0' || name[i] > '9' || __builtin_mul_overflow(value, 10, &value) ||
        __builtin_add_overflow(value, name[i] - '0', &value)) {
      return false;
    }
  }
  // Only the names StepDirName writes: a user's own "step-5" folder in a root is not ours to
  // list as a partial checkpoint, nor to remove as one.
  if (name != StepDirName(value)) return false;
  *step = value;
  return true;
}

namespace {

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace

std::string StepDirName(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "step-%09lld", static_cast<long long>(step));
  return buf;
}

std::string RankFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.bin", rank);
  return buf;
}

std::string RandomId() {
  std::random_device device;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", device(), device());
  return buf;
}

std::string TempDirName(int64_t step, const std::string& id) { return StepDirName(step) + ".tmp-" + id; }

namespace {
// `name` is StepDirName(step) + separator + RandomId(): only folders a save made are ours to
// list as leftovers and remove, not a user's own "step-3.tmp-old".
bool ParseStepAndId(const std::string& name, const char* separator, int64_t* step) {
  const size_t sep = name.rfind(separator);
  constexpr size_t kIdLength = 16;
  if (sep == std::string::npos || name.size() != sep + std::strlen(separator) + kIdLength) return false;
  for (size_t i = name.size() - kIdLength; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) && (name[i] < 'a' || name[i] > 'f')) return false;
  }
  return ParseStepDirName(name.substr(0, sep), step);
}
}  // namespace

bool IsTempDirName(const std::string& name) {
  int64_t step;
  return ParseStepAndId(name, ".tmp-", &step);
}

namespace {
constexpr char kRetiredPrefix[] = ".removing-";
}  // namespace

std::string RetiredDirName(const std::string& step_dir_name) {
  return kRetiredPrefix + step_dir_name + "-" + RandomId();
}

namespace {
bool ParseRetiredDirName(const std::string& name, int64_t* step) {
  const size_t prefix = sizeof(kRetiredPrefix) - 1;
  return name.compare(0, prefix, kRetiredPrefix) == 0 && ParseStepAndId(name.substr(prefix), "-", step);
}
}  // namespace

bool IsRetiredDirName(const std::string& name) {
  int64_t step;
  return ParseRetiredDirName(name, &step);
}

bool ParseLeftoverStepDirName(const std::string& name, int64_t* step) {
  return ParseStepAndId(name, ".tmp-", step) || ParseRetiredDirName(name, step);
}

Status RefuseCheckpointAsRoot(const std::string& root, const std::string& verb) {
  if (PathExists(JoinPath(root, kManifestName))) {
    return InvalidArgument(root + " is a checkpoint, not a root: " + verb + " the folder that holds its step folders");
  }
  if (!IsDcpFolder(root)) return Status::Ok();
  // A DCP folder has no step folders to point at.
  return InvalidArgument(root + " is a checkpoint, not a root (a PyTorch DCP folder: it holds " + kDcpMetadataFile +
                         "): " + verb + " a folder of shardckpt step folders, or a new one");
}

Status RefuseOutputInCheckpoint(const std::string& out, const std::string& checkpoint_dir) {
  std::error_code out_error, dir_error;
  const std::filesystem::path file =
      std::filesystem::weakly_canonical(std::filesystem::absolute(out, out_error), out_error);
  const std::filesystem::path dir = std::filesystem::weakly_canonical(checkpoint_dir, dir_error);
  if (out_error || dir_error) return Status::Ok();  // nothing to compare: the write reports a bad path
  auto [in_dir, in_file] = std::mismatch(dir.begin(), dir.end(), file.begin(), file.end());
  if (in_dir == dir.end()) {
    return InvalidArgument(out + " lies inside the checkpoint " + checkpoint_dir +
                           " being read: write it elsewhere (a checkpoint folder holds only what its save wrote)");
  }
  return RefuseOutputInCheckpoints(out);
}

Status RefuseOutputInCheckpoints(const std::string& out) {
  std::error_code out_error;
  const std::filesystem::path file =
      std::filesystem::weakly_canonical(std::filesystem::absolute(out, out_error), out_error);
  if (out_error) return Status::Ok();  // nothing to compare: the write reports a bad path
  // A committed checkpoint is a step folder with a manifest (a manifest.json of another kind, a
  // web app's, is no checkpoint), looked for along the path as spelled (a step folder may be a
  // link into an archive, whose target has another name) and with links resolved.
  std::error_code spelled_error;
  const std::filesystem::path spelled = std::filesystem::absolute(out, spelled_error).lexically_normal();
  for (const std::filesystem::path& path : {spelled, file}) {
    for (std::filesystem::path up = path.parent_path(); !up.empty(); up = up.parent_path()) {
      int64_t step = 0;
      if (ParseStepDirName(up.filename().string(), &step) && PathExists(JoinPath(up.string(), kManifestName))) {
        return InvalidArgument(out + " lies inside the checkpoint " + up.string() +
                               ": write it elsewhere (a checkpoint folder holds only what its save wrote)");
      }
      if (up == up.root_path()) break;
    }
  }
  // A name a save writes (a step, temporary or retired folder) right under a root (committed
  // checkpoints there, or a save's lock file), not yet a committed checkpoint: retention and the
  // next save take it for a leftover of a save of theirs and delete it, whatever it holds. The
  // path as spelled counts (a link there is removed as the entry it is), unless '..' in it may
  // climb out of a link.
  std::error_code raw_error;
  const std::filesystem::path raw = std::filesystem::absolute(out, raw_error);
  const bool climbs = std::any_of(raw.begin(), raw.end(), [](const std::filesystem::path& part) { return part == ".."; });
  std::vector<std::filesystem::path> paths = {file};
  if (!climbs && spelled != file) paths.push_back(spelled);
  for (const std::filesystem::path& path : paths) {
    for (std::filesystem::path at = path; !at.empty() && at != at.root_path(); at = at.parent_path()) {
      const std::string name = at.filename().string();
      int64_t step = 0;
      if (!ParseStepDirName(name, &step) && !IsTempDirName(name) && !IsRetiredDirName(name)) continue;
      const std::string root = at.parent_path().string();
      Result<std::vector<std::pair<int64_t, std::string>>> committed = ListCommitted(root);
      if ((committed.ok() && !committed->empty()) || PathExists(JoinPath(root, kLockName))) {
        return InvalidArgument(out + " would be " + (at == path ? "" : "inside ") + at.string() +
                               ", named as the checkpoint folders of the root " + root +
                               " are: its next save or prune would delete it; write it elsewhere");
      }
    }
  }
  // `latest`, and `latest.tmp`, which a commit writes and renames over it.
  if (file.filename() == kLatestName || file.filename() == std::string(kLatestName) + ".tmp") {
    Result<std::vector<std::pair<int64_t, std::string>>> committed = ListCommitted(file.parent_path().string());
    if (committed.ok() && !committed->empty()) {
      return InvalidArgument(out + " would replace the `latest` of the root " + DirName(out) +
                             " (or the file its saves rename over it), which names the checkpoint a resume "
                             "loads: write it elsewhere");
    }
  }
  return Status::Ok();
}

std::string ReadLatestName(const std::string& root) {
  Result<std::string> name = ReadFileLimited(JoinPath(root, kLatestName), 4096);
  return name.ok() ? Trim(*name) : std::string();
}

Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(const std::string& root) {
  return ListCommitted(root, nullptr);
}

Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(
    const std::string& root, std::vector<std::pair<int64_t, std::string>>* without_manifest) {
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<std::pair<int64_t, std::string>> out;
  if (without_manifest != nullptr) without_manifest->clear();
  for (const std::string& name : names) {
    int64_t step;
    if (!ParseStepDirName(name, &step)) continue;
    if (PathExists(JoinPath(JoinPath(root, name), kManifestName))) {
      out.emplace_back(step, name);
    } else if (without_manifest != nullptr) {
      without_manifest->emplace_back(step, name);
    }
  }
  std::sort(out.begin(), out.end());
  if (without_manifest != nullptr) std::sort(without_manifest->begin(), without_manifest->end());
  return out;
}

namespace {

// A step folder newer than the newest committed one that cannot be reached (an archive linked
// in and not mounted now): reading the older one would go back silently, and a resumed run's
// next save would collide with it. `without_manifest` from the listing that found `newest`.
Status RefuseUnreachableNewer(const std::string& root, const std::vector<std::pair<int64_t, std::string>>& without_manifest,
                              int64_t newest_step, const std::string& newest) {
  const auto [name, why] = UnreachableNewerThan(root, without_manifest, newest_step);
  if (name.empty()) return Status::Ok();
  if (newest.empty()) {
    return FailedPrecondition(JoinPath(root, name) + " is " + why + ", and " + root +
                              " holds no committed checkpoint: bring it back (mount the archive)");
  }
  return FailedPrecondition(JoinPath(root, name) + ", newer than " + newest + ", is " + why +
                            ": bring it back (mount the archive), or name the checkpoint folder to read, such as " +
                            JoinPath(root, newest));
}

}  // namespace

Result<std::string> ResolveCheckpoint(const std::string& path) {
  if (path.empty()) return InvalidArgument("the checkpoint path is empty (an unset variable?)");
  // A save's temporary folder holds its manifest just before the rename that commits it, and a
  // retired one is a checkpoint being deleted: neither is one to read, whatever it holds.
  // By the folder's own name, however the path reaches it ("TMP/.", a link, `cd TMP; verify .`).
  // The real name decides where there is one (a link named like a temporary folder may lead to a
  // committed one).
  std::string folder = WithoutTrailingSlashes(path);
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    folder = real;
    std::free(real);
  }
  if (const std::string name = BaseName(folder); IsTempDirName(name) || IsRetiredDirName(name)) {
    return FailedPrecondition(path + " is " +
                              (IsTempDirName(name) ? "the temporary folder of a save that is running or died before its "
                                                     "commit"
                                                   : "a checkpoint being deleted") +
                              ", not a committed checkpoint: `shardckpt list " + DirName(folder) +
                              "` shows the committed ones");
  }
  if (PathExists(JoinPath(path, kManifestName))) return path;
  if (IsDcpFolder(path)) return path;  // a PyTorch DCP folder, read in place (engine/formats/dcp_read.h)
  // A link that cannot be followed now (an archive not mounted, a loop) is named for what it is.
  if (const std::string why = UnreachableLink(path); !why.empty()) return FailedPrecondition(path + " is " + why);
  if (!PathExists(path)) return NotFound(path + " does not exist");
  const bool is_dir = IsDirectory(path);
  if (!is_dir) {
    // A model file (what consolidate writes, what torch.save and transformers write) is made a
    // checkpoint by import; for the manifest itself or a data file, the folder is what is meant.
    // Not a data file: a rank-*.bin, or a DCP folder's .distcp (a torch.save zip when its first item
    // is a tensor), whose folder is the checkpoint, read in place.
    const bool data_file = BaseName(path).compare(0, 5, "rank-") == 0 || EndsWith(path, ".distcp") ||
                           IsDcpFolder(DirName(path));
    if (!data_file && ModelFileKindOf(path).ok()) {
      return InvalidArgument(path + " is a model file, not a checkpoint: `shardckpt import " + path +
                             " --out ROOT --world-size N` (Python: shardckpt.import_checkpoint) makes one of it");
    }
    return InvalidArgument(path + " is a file: give the checkpoint folder (or the root) instead, such as " +
                           DirName(path));
  }
  const std::string latest = JoinPath(path, kLatestName);
  Result<std::vector<std::pair<int64_t, std::string>>> committed = std::vector<std::pair<int64_t, std::string>>{};
  std::vector<std::pair<int64_t, std::string>> without_manifest;
  bool has_latest = false;
  // A listing is a snapshot: a save can rename its newer step into place after the listing and
  // then retire the listed one before its manifest is checked, leaving none of the names listed
  // committed though the root always holds one (seen on tmpfs with readers looping beside
  // saves with keep_last=1). A root with `latest` and nothing committed is listed again.
  constexpr int kListings = 20;
  for (int listing = 0; listing < kListings; ++listing) {
    if (listing > 0) std::this_thread::sleep_for(std::chrono::milliseconds(listing));
    if (is_dir) committed = ListCommitted(path, &without_manifest);
    if (!committed.ok()) return committed.status();
    has_latest = PathExists(latest);
    if (!committed->empty() || !has_latest) break;
  }
  if (committed->empty()) {
    SC_RETURN_IF_ERROR(RefuseUnreachableNewer(path, without_manifest, -1, ""));
    if (has_latest) {
      Result<std::string> name = ReadFileLimited(latest, 4096);
      return NotFound(latest + " names " + (name.ok() ? "'" + WithNulsShown(Trim(*name)) + "'" : name.status().message()) +
                      ", but " + path + " holds no committed checkpoint (no step folder with " + kManifestName + ")");
    }
    int64_t step;
    if (ParseStepDirName(BaseName(path), &step)) {
      return NotFound(path + " is not a committed checkpoint (no " + kManifestName +
                      "): it is being removed by retention or prune, or its save did not finish");
    }
    // DCP's data files without their index: the folder was copied partly, or its save died
    // before rank 0 wrote .metadata (which DCP writes last).
    Result<std::vector<std::string>> names = ListDir(path);
    if (names.ok() && std::any_of(names->begin(), names->end(), [](const std::string& n) { return EndsWith(n, ".distcp"); })) {
      return NotFound(path + " holds PyTorch DCP data files (*.distcp) but no " + kDcpMetadataFile +
                      ", the index DCP writes last: the folder is incomplete (a save that did not finish, or a "
                      "partial copy), and cannot be read without it");
    }
    // A root whose first save has not committed yet (running, or dead): named as such.
    if (names.ok() && std::any_of(names->begin(), names->end(), [](const std::string& n) {
          int64_t s;
          return IsTempDirName(n) || ParseStepDirName(n, &s);
        })) {
      return NotFound(path + " is a root with no committed checkpoint yet: only folders of saves that are running or "
                             "did not finish (`shardckpt list " + path + "` shows them)");
    }
    // A Hugging Face model folder: pointed to import, as a model file is (above).
    if (Result<std::string> model = ResolveModelFile(path); model.ok() && ModelFileKindOf(*model).ok()) {
      return InvalidArgument(path + " is a model folder (" + BaseName(*model) + "), not a checkpoint: `shardckpt import " +
                             path + " --out ROOT --world-size N` (Python: shardckpt.import_checkpoint) makes one of it");
    }
    return NotFound(path + " is neither a checkpoint (no " + kManifestName + ") nor a root (no " + kLatestName +
                    " and no committed step folder)");
  }
  const std::string& newest = committed->back().second;
  SC_RETURN_IF_ERROR(RefuseUnreachableNewer(path, without_manifest, committed->back().first, newest));
  if (has_latest && !CheckLatestIsNoFolder(path).ok()) {
    LogOnce(LogLevel::kWarn, "latest-folder:" + latest,
            latest + " is a folder, where shardckpt keeps the file that names the newest checkpoint; reading the "
                     "newest committed one, " + newest + " (saves into this root are refused until it is moved)");
  } else if (has_latest && ReadLatestName(path) != newest) {
    // A warning: an operator who edited `latest` to go back would otherwise load the newer one
    // without a word.
    LogOnce(LogLevel::kWarn, "stale-latest:" + latest,
            latest + " does not name the newest committed checkpoint " + newest +
                " (a save is committing now, or stopped between its rename and `latest`, or it was edited); using " + newest +
                " (to read another checkpoint, name its folder)");
  }
  // A newer step folder without a manifest (saves rename whole folders into place, and retention
  // removes older ones): its manifest deleted, or a copy that stopped short. Read past, said once.
  for (const auto& [step, name] : without_manifest) {
    if (step <= committed->back().first) continue;
    LogOnce(LogLevel::kWarn, "newer-without-manifest:" + JoinPath(path, name),
            JoinPath(path, name) + ", newer than " + newest + ", has no " + kManifestName +
                " (deleted, a copy that stopped short, or a save removing its own failed commit): it is not a "
                "checkpoint; using " + newest);
    break;
  }
  return JoinPath(path, newest);
}

CheckpointHold& CheckpointHold::operator=(CheckpointHold&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    dir_ = std::move(other.dir_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

CheckpointHold::~CheckpointHold() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

Result<CheckpointHold> HoldCheckpoint(const std::string& path) {
  // Each retry means retention removed the newest checkpoint between resolving and locking,
  // which a save that just committed a newer one does: the next resolve finds that one.
  constexpr int kAttempts = 50;
  std::string gone;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    Result<std::string> dir = ResolveCheckpoint(path);
    if (!dir.ok()) {
      if (gone.empty()) return dir.status();
      return NotFound(gone + " was removed by retention while being opened, and then: " + dir.status().message());
    }
    CheckpointHold hold;
    hold.dir_ = *dir;
    hold.fd_ = ::open(dir->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (hold.fd_ < 0 && errno != ENOENT) return ErrnoStatus(errno, "open checkpoint folder " + *dir);
    if (hold.fd_ >= 0) {
      int rc;
      while ((rc = ::flock(hold.fd_, LOCK_SH)) != 0 && errno == EINTR) {
      }
      // A filesystem without flock on folders (some network ones): read unprotected, as before.
      if (rc != 0) SC_LOG(kInfo) << "no shared lock on " << *dir << " (" << std::strerror(errno) << "); retention cannot see this reader";
      // Deletion drops the manifest under the exclusive lock before anything else, so a
      // manifest seen under the shared lock means every data file is there and stays. Reads go
      // by path: the path must still name the locked folder (a removed link does not).
      struct stat by_path, locked;
      if ((::faccessat(hold.fd_, kManifestName, F_OK, 0) == 0 || ::faccessat(hold.fd_, kDcpMetadataFile, F_OK, 0) == 0) &&
          ::stat(dir->c_str(), &by_path) == 0 &&
          ::fstat(hold.fd_, &locked) == 0 && by_path.st_dev == locked.st_dev && by_path.st_ino == locked.st_ino) {
        return hold;
      }
    }
    gone = *dir;
    if (*dir == path) {
      return NotFound(path + " was removed by retention (or prune) while being opened; it was not damaged");
    }
  }
  return NotFound("the newest checkpoint of " + path + " was removed by retention " +
                  std::to_string(kAttempts) + " times in a row while being opened");
}

Result<bool> RemoveCheckpointDir(const std::string& root, const std::string& name, Removal when) {
  if (!IsPlainFileName(name)) return InvalidArgument("refusing to delete '" + name + "': not a name inside " + root);
  std::string path = JoinPath(root, name);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    return ErrnoStatus(errno, "lstat " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    // A symlink (to a folder elsewhere, an archived checkpoint) or a stray file: the entry
    // under the root goes, whatever it points to stays. A reader of a linked checkpoint locks
    // the folder the link names and reads through the link, so a held target keeps the link;
    // the exclusive lock, held across the unlink, only tests that (the target is not changed).
    int target = S_ISLNK(st.st_mode) ? ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (target >= 0 && ::flock(target, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(target);
      return false;
    }
    SC_LOG(kInfo) << "removing " << path << (S_ISLNK(st.st_mode) ? " (a symlink; its target is left alone)" : "");
    Status status = Failpoint("retention.remove", "unlink " + path);
    if (status.ok() && ::unlink(path.c_str()) != 0 && errno != ENOENT) status = ErrnoStatus(errno, "unlink " + path);
    if (target >= 0) ::close(target);
    SC_RETURN_IF_ERROR(status);
    return true;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    // Gone since the lstat: another process finished removing it (a save's background removal
    // of a retired folder while a prune cleans leftovers).
    if (errno == ENOENT) return true;
    return ErrnoStatus(errno, "open " + path);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      ::close(fd);
      return false;
    }
    // No flock here (readers could not lock either): delete as without readers.
    SC_LOG(kInfo) << "no lock on " << path << " (" << std::strerror(errno) << "); removing it unguarded";
  }
  Status status = Failpoint("retention.remove", "remove " + path);
  // unlinkat removes the entry itself: a manifest.json that is a symlink loses only the link.
  if (status.ok() && ::unlinkat(fd, kManifestName, 0) != 0 && errno != ENOENT) {
    status = ErrnoStatus(errno, "unlink " + JoinPath(path, kManifestName));
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoStatus(errno, "fsync directory " + path);
  if (status.ok()) status = Failpoint("retention.remove_tree", "remove " + path);
  if (status.ok() && when == Removal::kInBackground) {
    // No longer committed; out of the step names it goes, and the bytes are freed later. A
    // crash between the rename and the end of the deletion leaves a retired folder, removed by
    // the next save. Where the rename fails the folder is removed here, as kNow would.
    std::error_code ec;
    const std::string retired = std::filesystem::absolute(JoinPath(root, RetiredDirName(name)), ec).string();
    if (ec) {
      SC_LOG(kInfo) << "no absolute path for " << path << " (" << ec.message() << "); removing it before the save returns";
    } else if (::rename(path.c_str(), retired.c_str()) != 0) {
      SC_LOG(kInfo) << "could not rename " << path << " to " << retired << " (" << std::strerror(errno)
                    << "); removing it before the save returns";
    } else if (RemoveInBackground(retired, fd)) {
      return true;
    } else {
      path = retired;  // renamed already: removed here instead
    }
  }
  // remove_all does not follow symlinks: a linked rank file or sub-folder loses only its link.
  if (status.ok()) status = RemoveTree(path);
  ::close(fd);
  SC_RETURN_IF_ERROR(status);
  return true;
}

bool HeldByReader(const std::string& root, const std::string& name) {
  if (!IsPlainFileName(name)) return false;
  // As RemoveCheckpointDir tests it: an exclusive lock refused now; released at once. A removal
  // that tries in that instant (a save's retention, a prune) sees it held and leaves the folder
  // for the next one, as it would for a reader.
  const int fd = ::open(JoinPath(root, name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

std::string FirstEntryNoSaveWrites(const std::string& dir) {
  Result<std::vector<std::string>> names = ListDir(dir);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    // NFS keeps a file unlinked while another host holds it open as .nfsXXXX until it is closed.
    if (name == kManifestName || name.compare(0, 4, ".nfs") == 0) continue;
    // RankFileName: "rank-", five digits or more, ".bin".
    const bool rank_file = name.size() >= 14 && name.compare(0, 5, "rank-") == 0 &&
                           name.compare(name.size() - 4, 4, ".bin") == 0 &&
                           std::all_of(name.begin() + 5, name.end() - 4, [](char c) { return c >= '0' && c <= '9'; });
    if (!rank_file) return name;
  }
  return "";
}

namespace {
std::string LinkTarget(const std::string& link) {
  std::error_code error;
  const std::filesystem::path to = std::filesystem::read_symlink(link, error);
  return error ? std::string("?") : to.string();
}
}  // namespace

std::string UnreachableLink(const std::string& path) {
  // "dir/" makes lstat follow the link: the name itself is looked at.
  const std::string name = WithoutTrailingSlashes(path);
  int error = 0;
  if (!IsDanglingLink(name, &error)) return "";
  return "a link to " + LinkTarget(name) + ", which cannot be reached (" + std::strerror(error) + ")";
}

std::string UnreachableStepFolder(const std::string& dir) {
  // Links only, and still links after the stat that failed (IsDanglingLink): a manifest that
  // retention unlinks (or a folder it renames away) meanwhile is a name gone, not unreachable.
  if (std::string link = UnreachableLink(dir); !link.empty()) return link;
  int error = 0;
  const std::string manifest = JoinPath(dir, kManifestName);
  if (IsDanglingLink(manifest, &error)) {
    return "a folder whose " + std::string(kManifestName) + " is a link to " + LinkTarget(manifest) +
           ", which cannot be reached (" + std::strerror(error) + ")";
  }
  // Not "no manifest" either: one that cannot be looked for (no permission on the folder, EIO,
  // ESTALE on a network file system). Only ENOENT (and ENOTDIR) say it is not there.
  struct stat st {};
  if (::stat(manifest.c_str(), &st) != 0 && errno != ENOENT && errno != ENOTDIR) {
    return "a folder whose " + std::string(kManifestName) + " cannot be looked for (" + std::strerror(errno) + ")";
  }
  return "";
}

std::pair<std::string, std::string> UnreachableNewerThan(
    const std::string& root, const std::vector<std::pair<int64_t, std::string>>& without_manifest, int64_t step) {
  for (const auto& [at, name] : without_manifest) {
    if (at <= step) continue;
    if (std::string why = UnreachableStepFolder(JoinPath(root, name)); !why.empty()) return {name, why};
  }
  return {"", ""};
}

Status RefuseEmptyRoot(const std::string& root) {
  if (root.empty()) return InvalidArgument("the checkpoint root is an empty path (an unset variable?)");
  return Status::Ok();
}

bool HoldsCheckpoints(const std::string& root) {
  Result<bool> holds = ListHoldsCheckpoints(root);
  return holds.ok() && *holds;
}

Result<bool> ListHoldsCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> without_manifest;
  SC_ASSIGN_OR_RETURN(const auto committed, ListCommitted(root, &without_manifest));
  return !committed.empty() || !UnreachableNewerThan(root, without_manifest, INT64_MIN).first.empty();
}

Status LeftUnreachable(const std::string& root, const std::string& name, const std::string& why) {
  return FailedPrecondition(JoinPath(root, name) + " is " + why + ": left as it is (no save leaves that); bring its " +
                            "target back, or remove it once it is not needed");
}

Status LeftForItsFiles(const std::string& root, const std::string& name, const std::string& foreign) {
  if (foreign == name) {
    return FailedPrecondition(JoinPath(root, name) + " is a file, not a folder a save writes: left as it is; move it " +
                              "out of the root once it is not needed");
  }
  return FailedPrecondition(JoinPath(root, name) + " has no manifest but holds " + foreign +
                            ", which no save writes (someone's own files): left as it is; move the files out, or "
                            "remove the folder, once it is not needed");
}

Status CheckPlannedStepFolders(const std::string& root, const std::function<bool(int64_t)>& planned) {
  Result<std::vector<std::string>> names = ListDir(root);
  if (!names.ok()) return Status::Ok();  // no root yet: nothing in the way
  std::sort(names->begin(), names->end());  // the first step the run reaches, first
  for (const std::string& name : *names) {
    int64_t step;
    if (!ParseStepDirName(name, &step) || !planned(step)) continue;
    const std::string path = JoinPath(root, name);
    if (PathExists(JoinPath(path, kManifestName))) continue;  // a checkpoint: the root's checks decide
    Status left = Status::Ok();
    if (const std::string why = UnreachableStepFolder(path); !why.empty()) {
      left = LeftUnreachable(root, name, why);
    } else if (IsPlainNonFolder(path)) {
      left = LeftForItsFiles(root, name, name);
    } else if (const std::string foreign = FirstEntryNoSaveWrites(path); !foreign.empty()) {
      left = LeftForItsFiles(root, name, foreign);
    }
    if (!left.ok()) return FailedPrecondition(left.message() + "; it is in the way of step " + std::to_string(step) + "'s save");
  }
  return Status::Ok();
}

Status RemoveStaleTempDirs(const std::string& root, std::vector<std::string>* removed_names,
                           std::vector<std::string>* left_names, std::vector<RemovalFailure>* failed) {
  WaitForBackgroundRemovals();
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  for (const std::string& name : names) {
    int64_t step;
    const bool half_deleted = ParseStepDirName(name, &step) && !PathExists(JoinPath(JoinPath(root, name), kManifestName));
    const bool retired = IsRetiredDirName(name);
    if (!IsTempDirName(name) && !half_deleted && !retired) continue;
    if (half_deleted) {
      if (const std::string why = UnreachableStepFolder(JoinPath(root, name)); !why.empty()) {
        Status kept = LeftUnreachable(root, name, why);
        SC_LOG(kWarn) << kept.message();
        if (failed != nullptr) failed->push_back(RemovalFailure{name, kept, /*on_purpose=*/true});
        continue;
      }
    }
    // A save writes folders only: a file so named is someone's (its name is what it holds). A
    // link is a step folder kept elsewhere, and a name gone since the listing is no file.
    const bool folder = !IsPlainNonFolder(JoinPath(root, name));
    if (half_deleted || !folder) {
      const std::string foreign = folder ? FirstEntryNoSaveWrites(JoinPath(root, name)) : name;
      if (!foreign.empty()) {
        Status kept = LeftForItsFiles(root, name, foreign);
        SC_LOG(kWarn) << kept.message();
        if (failed != nullptr) failed->push_back(RemovalFailure{name, kept, /*on_purpose=*/true});
        continue;
      }
    }
    SC_LOG(kWarn) << "removing " << JoinPath(root, name)
                  << (half_deleted ? ", a step folder without a manifest (a deletion or commit cut short)"
                      : retired    ? ", a checkpoint retention retired (its deletion did not finish, or a save's retention is deleting it now)"
                                   : ", left by a save that did not finish");
    Result<bool> removal = RemoveCheckpointDir(root, name);
    if (!removal.ok()) {
      SC_LOG(kWarn) << "could not remove " << JoinPath(root, name) << ": " << removal.status().ToString()
                    << "; passed over (the next save or prune tries again)";
      if (failed != nullptr) failed->push_back(RemovalFailure{name, removal.status()});
      continue;
    }
    const bool removed = *removal;
    if (!removed) {
      SC_LOG(kWarn) << JoinPath(root, name)
                    << (retired ? " is being removed by another process" : " is held by a reader; left for a later save");
    }
    std::vector<std::string>* into = removed ? removed_names : left_names;
    if (into != nullptr) into->push_back(name);
  }
  return Status::Ok();
}

Status CheckLatestIsNoFolder(const std::string& root) {
  const std::string latest = JoinPath(root, kLatestName);
  if (struct stat st {}; ::lstat(latest.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return FailedPrecondition(latest + " is a folder, where shardckpt keeps the file that names the newest checkpoint: "
                              "move it out of the root (readers find the newest step folder without it)");
  }
  return Status::Ok();
}

Status RepairLatest(const std::string& root) {
  SC_RETURN_IF_ERROR(CheckLatestIsNoFolder(root));
  const std::string latest = JoinPath(root, kLatestName);
  std::vector<std::pair<int64_t, std::string>> without_manifest;
  SC_ASSIGN_OR_RETURN(auto committed, ListCommitted(root, &without_manifest));
  if (committed.empty()) return Status::Ok();
  const std::string& newest = committed.back().second;
  // A newer step folder that cannot be reached now is the newest once it can be again: `latest`
  // is not turned back to an older one meanwhile.
  if (!UnreachableNewerThan(root, without_manifest, committed.back().first).first.empty()) return Status::Ok();
  const std::string named = ReadLatestName(root);
  if (named == newest) return Status::Ok();
  SC_LOG(kWarn) << "repairing " << latest << ": it named " << (named.empty() ? "nothing" : "'" + WithNulsShown(named) + "'")
                << ", the newest committed checkpoint is " << newest;
  return WriteFileAtomic(latest, newest + "\n", "commit.repair_latest");
}

namespace {

// Root lock files this process holds, by (device, inode): a save refused because its own
// process holds the root (an async save's persist in flight) is told so, not "two jobs".
std::mutex g_held_mutex;
std::multiset<std::pair<dev_t, ino_t>> g_held;

std::pair<dev_t, ino_t> FileIdentity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

bool HeldByThisProcess(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  std::lock_guard<std::mutex> lock(g_held_mutex);
  return g_held.count({st.st_dev, st.st_ino}) != 0;
}

// An exclusive flock on root/name without waiting: the fd, -1 when another holder has it.
Result<int> TryLockFile(const std::string& root, const char* name) {
  const std::string path = JoinPath(root, name);
  SC_RETURN_IF_ERROR(Failpoint("lock.open", "open " + path));
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  int err = errno;
  ::close(fd);
  if (err == EWOULDBLOCK) return -1;
  return ErrnoStatus(err, "flock " + path);
}

// Whether someone holds root's lock file `name` (tested with a shared lock that is let go at
// once; a missing file is not held, and is not created).
// Whether another holds an exclusive flock on `fd` (which this closes).
bool ExclusivelyHeld(int fd) {
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

bool LockHeld(const std::string& root, const char* name) {
  Result<int> opened = OpenFileNotFifo(JoinPath(root, name), O_RDONLY);
  return opened.ok() && ExclusivelyHeld(*opened);
}

// "8", "1199", "0.5": seconds as a message gives them (as typed, for a whole number).
std::string SecondsText(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), seconds == static_cast<double>(static_cast<int64_t>(seconds)) ? "%.0f" : "%.1f",
                seconds);
  return text;
}

// The root folder's own flock: a prune holds it exclusively when it could not make its lock file
// (a full disk or inode quota), so that a save still tells a prune from another save. It needs
// no inode of its own.
int LockRootFolder(const std::string& root) {
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  ::close(fd);
  return err == EWOULDBLOCK ? -2 : -1;
}

bool RootFolderLockHeld(const std::string& root) {
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return fd >= 0 && ExclusivelyHeld(fd);
}

bool PruneHolds(const std::string& root) { return LockHeld(root, kPruneLockName) || RootFolderLockHeld(root); }

}  // namespace

Result<RootLock> RootLock::Acquire(const std::string& root) {
  // A prune removes a few folders and lets go; ten minutes means it is stuck. A save's other
  // ranks wait for this one in a collective meanwhile: past their deadline they end the job
  // blaming this rank (a trial: a prune suspended with Ctrl-Z, SHARDCKPT_COLLECTIVE_TIMEOUT_S=8),
  // so this one gives up first, its reason then every rank's.
  const double collective_s = CollectiveTimeoutFromEnvironment();
  const double patience_s = collective_s > 0 ? std::min(600.0, collective_s / 2) : 600.0;
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(patience_s));
  bool said = false, prune_seen = false;
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  // The root lock held without the prune lock is another save, or a prune caught between
  // letting go of the root lock and of its own (or the next prune between taking its two):
  // only seen so several times running is it another save, which holds the lock for seconds.
  int without_prune = 0;
  for (;;) {
    SC_ASSIGN_OR_RETURN(int fd, TryLockFile(root, kLockName));
    if (fd >= 0) {
      RootLock lock(fd, -1);
      lock.waited_s_ = prune_seen ? waited() : 0;  // not the retries while another save held it
      if (said) SC_LOG(kInfo) << "the prune of " << root << " let go after " << SecondsText(lock.waited_s_) << " s; saving";
      return lock;
    }
    if (!PruneHolds(root)) {
      if (++without_prune < 5) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (HeldByThisProcess(JoinPath(root, kLockName))) {
        return FailedPrecondition("a save of this process (another thread's, or an async save's persist in "
                                  "flight) is writing into " + root + ": wait for it (its handle's Wait, or "
                                  "AsyncSaver::Wait) before another save into the root");
      }
      return FailedPrecondition("another save is writing into " + root + " (lock " + JoinPath(root, kLockName) +
                                " is held); two jobs must not save into one root");
    }
    without_prune = 0;
    prune_seen = true;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      const bool by_collective = patience_s < 600.0;
      return FailedPrecondition(
          "a prune has held " + root + " for " + SecondsText(waited()) + " s (lock " + JoinPath(root, kPruneLockName) +
          " or the folder's own is held: a prune stuck, or suspended); the save gives up" +
          (by_collective ? " at half the collective deadline (SHARDCKPT_COLLECTIVE_TIMEOUT_S=" + SecondsText(collective_s) +
                               "), before a save's other ranks, waiting for this one in a collective, would blame it"
                         : ""));
    }
    if (!said && now - started > std::chrono::seconds(1)) {
      said = true;
      SC_LOG(kWarn) << "waiting for a prune of " << root << " to let go of it (lock " << JoinPath(root, kPruneLockName)
                    << " is held); the save goes on then, or gives up after " << SecondsText(patience_s) << " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<RootLock> RootLock::AcquireForPrune(const std::string& root) {
  auto busy = [&] {
    return FailedPrecondition("a save or another prune is writing into " + root + " (lock " +
                              JoinPath(root, kLockName) + " is held); prune again when it is done");
  };
  Result<int> prune_lock = TryLockFile(root, kPruneLockName);
  // A full disk (or inode quota) where no prune ran before has no room for the prune lock file,
  // and prune is how the operator frees space: the root folder's own flock stands in for it.
  if (!prune_lock.ok() && prune_lock.status().code() == Code::kNoSpace) {
    const int folder = LockRootFolder(root);
    if (folder == -2) return busy();  // another prune holds the folder
    SC_LOG(kWarn) << "no room for " << JoinPath(root, kPruneLockName) << "; pruning under a lock on the folder " << root
                  << (folder < 0 ? " (not to be had here: a save meanwhile fails as beside another save)" : "");
    prune_lock = folder;  // -1: none to be had, the root lock alone
  } else {
    SC_RETURN_IF_ERROR(prune_lock.status());
    if (*prune_lock < 0) return busy();
  }
  const int prune_fd = *prune_lock;
  Result<int> fd = TryLockFile(root, kLockName);
  if (!fd.ok() || *fd < 0) {
    if (prune_fd >= 0) ::close(prune_fd);
    return fd.ok() ? busy() : fd.status();
  }
  return RootLock(*fd, prune_fd);
}

bool RootLock::Held(const std::string& root) { return LockHeld(root, kLockName); }

std::string AbsoluteRoot(const std::string& root) {
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(root, ec);
  if (ec) return root;
  // Not lexically_normal: "link/../x" is where the link points, then up, as the kernel resolves it.
  return WithoutTrailingSlashes(absolute.string());
}

namespace {
std::mutex g_reserved_mutex;
std::multiset<std::string> g_reserved;
thread_local std::string t_persist_root;  // the root this thread's persist writes (its own reservation)
}  // namespace

PersistReservation::PersistReservation(std::string absolute_root) : root_(std::move(absolute_root)) {
  std::lock_guard<std::mutex> lock(g_reserved_mutex);
  g_reserved.insert(root_);
}

PersistReservation::~PersistReservation() {
  std::lock_guard<std::mutex> lock(g_reserved_mutex);
  auto it = g_reserved.find(root_);
  if (it != g_reserved.end()) g_reserved.erase(it);
}

void PersistReservation::OnPersistThread() const { t_persist_root = root_; }

Status PersistReservation::CheckNotReserved(const std::string& root) {
  const std::string key = AbsoluteRoot(root);
  std::lock_guard<std::mutex> lock(g_reserved_mutex);
  // A persist's own save passes its own reservation, no other (one more async save of the root).
  const size_t others = g_reserved.count(key) - (t_persist_root == key && g_reserved.count(key) > 0 ? 1 : 0);
  if (others == 0) return Status::Ok();
  return FailedPrecondition("an async save's persist in flight in this process is writing into " + root +
                            ": wait for it (its handle's Wait, or AsyncSaver::Wait) before another save into the root");
}

RootLock::RootLock(int fd, int prune_fd) : fd_(fd), prune_fd_(prune_fd) {
  std::lock_guard<std::mutex> lock(g_held_mutex);
  g_held.insert(FileIdentity(fd_));
}

RootLock::~RootLock() {
  if (fd_ >= 0) {
    std::lock_guard<std::mutex> lock(g_held_mutex);
    auto it = g_held.find(FileIdentity(fd_));
    if (it != g_held.end()) g_held.erase(it);
  }
  // Closing releases each flock; the root lock goes first, so a save never sees it held
  // without the prune lock.
  if (fd_ >= 0) ::close(fd_);
  if (prune_fd_ >= 0) ::close(prune_fd_);
}

}  // namespace shardckpt
