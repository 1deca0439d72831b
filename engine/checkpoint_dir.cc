#include "shardckpt/engine/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "shardckpt/engine/manifest.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

bool ParseStepDir(const std::string& name, int64_t* step) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return false;
  int64_t value = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || value > (INT64_MAX - 9) / 10) return false;
    value = value * 10 + (name[i] - '0');
  }
  *step = value;
  return true;
}

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

bool IsTempDirName(const std::string& name) {
  return name.compare(0, 5, "step-") == 0 && name.find(".tmp-") != std::string::npos;
}

Result<std::string> ResolveCheckpoint(const std::string& path) {
  if (PathExists(JoinPath(path, kManifestName))) return path;
  const std::string latest = JoinPath(path, kLatestName);
  if (PathExists(latest)) {
    SC_ASSIGN_OR_RETURN(std::string name, ReadFileLimited(latest, 4096));
    name = Trim(name);
    if (!IsPlainFileName(name)) return DataLoss(latest + " holds '" + name + "', not a checkpoint folder name");
    std::string dir = JoinPath(path, name);
    if (!PathExists(JoinPath(dir, kManifestName))) {
      return NotFound(latest + " points to " + dir + ", which has no " + kManifestName);
    }
    return dir;
  }
  if (!PathExists(path)) return NotFound(path + " does not exist");
  return NotFound(path + " is neither a checkpoint (no " + kManifestName + ") nor a root (no " +
                  kLatestName + ")");
}

Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(const std::string& root) {
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<std::pair<int64_t, std::string>> out;
  for (const std::string& name : names) {
    int64_t step;
    if (ParseStepDir(name, &step) && PathExists(JoinPath(JoinPath(root, name), kManifestName))) {
      out.emplace_back(step, name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status ApplyRetention(const std::string& root, int keep_last, const std::string& just_committed) {
  if (keep_last <= 0) return Status::Ok();
  SC_ASSIGN_OR_RETURN(auto committed, ListCommitted(root));
  Result<std::string> latest = ReadFileLimited(JoinPath(root, kLatestName), 4096);
  std::string latest_name = latest.ok() ? Trim(*latest) : std::string();
  int excess = static_cast<int>(committed.size()) - keep_last;
  for (int i = 0; i < excess; ++i) {
    const std::string& name = committed[i].second;
    if (name == just_committed || name == latest_name) break;
    SC_LOG(kInfo) << "retention: removing " << JoinPath(root, name);
    // Drop the manifest first: a crash halfway through leaves an uncommitted folder, not a
    // committed one with missing data files.
    if (::unlink(JoinPath(JoinPath(root, name), kManifestName).c_str()) != 0) {
      return ErrnoStatus(errno, "retention: unlink manifest of " + name);
    }
    SC_RETURN_IF_ERROR(RemoveTree(JoinPath(root, name)));
  }
  return Status::Ok();
}

Status RemoveStaleTempDirs(const std::string& root) {
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  for (const std::string& name : names) {
    if (!IsTempDirName(name)) continue;
    SC_LOG(kWarn) << "removing " << JoinPath(root, name) << ", left by a save that did not finish";
    SC_RETURN_IF_ERROR(RemoveTree(JoinPath(root, name)));
  }
  return Status::Ok();
}

Result<RootLock> RootLock::Acquire(const std::string& root) {
  const std::string path = JoinPath(root, kLockName);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPrecondition("another save is writing into " + root + " (lock " + path +
                                " is held); two jobs must not save into one root");
    }
    return ErrnoStatus(err, "flock " + path);
  }
  return RootLock(fd);
}

RootLock::~RootLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace shardckpt
