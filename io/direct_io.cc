#include "shardckpt/io/direct_io.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
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
  *direct = false;
  if (prefer_direct && IsMemoryBacked(path)) {
    prefer_direct = false;
    LogOnce(LogLevel::kInfo, "memory-backed",
            DirName(path) + " is memory-backed (tmpfs/ramfs): reading and writing its files without O_DIRECT "
                            "(checkpoint data straight from and into tensor memory)");
  }
  if (prefer_direct) {
    int open_errno = 0;
    Result<int> fd = OpenFileNotFifo(path, flags | O_DIRECT, 0644, &open_errno);
    if (fd.ok()) {
      *direct = true;
      return fd;
    }
    if (open_errno != EINVAL) return fd.status();
    // EINVAL is also O_DIRECT on a FIFO or device: opened (or refused) below as such, not logged.
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {
      LogOnce(LogLevel::kWarn, "odirect-refused",
              "O_DIRECT refused by the file system of " + path + "; using buffered I/O for such files");
    }
  }
  return OpenFileNotFifo(path, flags);
}

}  // namespace shardckpt
