// Small file-system steps used by the commit protocol and the tools. Each one that changes the
// file system passes through a named failpoint, so tests can fail any commit step in turn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

std::string JoinPath(const std::string& dir, const std::string& name);
std::string DirName(const std::string& path);   // "." for a bare name
std::string BaseName(const std::string& path);
bool EndsWith(const std::string& text, const std::string& suffix);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

Status MakeDir(const std::string& path);
Status MakeDirs(const std::string& path);
// fsync of a directory: makes the renames and creations inside it durable.
Status SyncDir(const std::string& path, const char* failpoint = "fs.sync_dir");
Status Rename(const std::string& from, const std::string& to, const char* failpoint = "fs.rename");
Status RemoveTree(const std::string& path);
Result<std::vector<std::string>> ListDir(const std::string& path);
Result<uint64_t> FileSize(const std::string& path);

// Reads a whole file, refusing files larger than max_bytes before allocating anything.
Result<std::string> ReadFileLimited(const std::string& path, uint64_t max_bytes);
// Writes `bytes` to `path` durably and atomically: temp file in the same folder, fsync, rename,
// fsync of the folder. Readers see the old contents or the new, never a mix.
Status WriteFileAtomic(const std::string& path, const std::string& bytes,
                       const char* failpoint_prefix);

}  // namespace shardckpt
