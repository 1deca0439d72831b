// The root folder's conventions (docs/format.md): step folder names, the `latest` pointer,
// save-in-progress folders, the writer lock and retention.
#pragma once

#include <cstdint>
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
std::string RankFileName(int rank);  // rank-00003.bin
std::string RandomId();              // for temp folder names

// A committed checkpoint folder (holds manifest.json) is returned as is; a root is resolved
// through its `latest` pointer. Anything else is NotFound with a message saying what was there.
Result<std::string> ResolveCheckpoint(const std::string& path);

// Committed checkpoints under root as (step, folder name), oldest first.
Result<std::vector<std::pair<int64_t, std::string>>> ListCommitted(const std::string& root);

// Keeps the newest `keep_last` committed checkpoints (0 keeps all). Never touches
// `just_committed`, `latest`'s target or anything newer than it, and never a temp folder.
Status ApplyRetention(const std::string& root, int keep_last, const std::string& just_committed);

// Removes save-in-progress folders left by crashed saves. Called with the root lock held.
Status RemoveStaleTempDirs(const std::string& root);

// An exclusive flock on <root>/.shardckpt.lock, held by rank 0 for the length of a save, so two
// jobs saving into one root cannot interleave: the second fails at once with a clear error.
class RootLock {
 public:
  static Result<RootLock> Acquire(const std::string& root);
  RootLock(RootLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RootLock& operator=(RootLock&&) = delete;
  RootLock(const RootLock&) = delete;
  ~RootLock();

 private:
  explicit RootLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace shardckpt
