// Whether a file is opened with O_DIRECT: the one decision every engine and whole-file helper
// (fs.h) shares.
#pragma once

#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

// Whether the folder holding `path` is memory-backed (tmpfs, ramfs): files there are page cache,
// opened without O_DIRECT, and every process reading them shares the same copy.
bool IsMemoryBacked(const std::string& path);

// open(2) of `path` with `flags`, plus O_DIRECT when `prefer_direct` and the file system takes
// it: not on a memory-backed one (O_DIRECT there still copies into the page cache, but demands
// aligned memory), nor where the file system refuses it (EINVAL: tmpfs before Linux 6.6, some
// FUSE and network file systems). Each of those is logged once per process. *direct says which.
Result<int> OpenPreferDirect(const std::string& path, int flags, bool prefer_direct, bool* direct);

}  // namespace shardckpt
