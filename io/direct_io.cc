#include "shardckpt/io/direct_io.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>

#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

bool IsMemoryBacked(const std::string& path) {
  struct statfs fs;
  if (::statfs(DirName(path).c_str(), &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

Result<int> OpenPreferDirect(const std::string& path, int flags, bool prefer_direct, bool* direct) {
  flags |= O_CLOEXEC;
  *direct = false;
  if (prefer_direct && IsMemoryBacked(path)) {
    prefer_direct = false;
    LogOnce(LogLevel::kInfo, "memory-backed",
            DirName(path) + " is memory-backed (tmpfs/ramfs): reading and writing its files without O_DIRECT "
                            "(checkpoint data straight from and into tensor memory)");
  }
  if (prefer_direct) {
    int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0) {
      *direct = true;
      return fd;
    }
    if (errno != EINVAL) return ErrnoStatus(errno, "open " + path);
    LogOnce(LogLevel::kWarn, "odirect-refused",
            "O_DIRECT refused by the file system of " + path + "; using buffered I/O for such files");
  }
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  return fd;
}

}  // namespace shardckpt
