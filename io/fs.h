// Small file-system steps used by the commit protocol and the tools. Each one that changes the
// file system passes through a named failpoint, so tests can fail any commit step in turn.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

std::string JoinPath(const std::string& dir, const std::string& name);
std::string DirName(const std::string& path);   // "." for a bare name
std::string BaseName(const std::string& path);
// `path` without trailing slashes ("/" stays "/"): "a/b/" and "a/b" name one folder.
std::string WithoutTrailingSlashes(std::string path);
bool EndsWith(const std::string& text, const std::string& suffix);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// Whether both paths exist and name the same file or folder (device and inode).
bool SameFile(const std::string& a, const std::string& b);
// Whether `path` exists and is no folder: a regular file, FIFO, socket or device, or a link to
// one (a link to a folder, or a dangling one, is not).
bool IsPlainNonFolder(const std::string& path);
// Whether `path` is a symbolic link whose target cannot be reached now, and still a link after
// the stat that failed: a name unlinked between the two calls is gone, not dangling. `error`
// gets that stat's errno.
bool IsDanglingLink(const std::string& path, int* error = nullptr);

Status MakeDir(const std::string& path);
Status MakeDirs(const std::string& path);

// MakeDirs for an output that may still fail: the folders it made are removed again (if still
// empty) when it goes out of scope, unless Keep() was called. A refused consolidation left the
// empty folders of its --out path behind.
class MadeDirs {
 public:
  explicit MadeDirs(const std::string& path);
  ~MadeDirs();
  MadeDirs(const MadeDirs&) = delete;
  MadeDirs& operator=(const MadeDirs&) = delete;
  const Status& status() const { return status_; }
  void Keep() { made_.clear(); }

 private:
  std::vector<std::string> made_;  // deepest first
  Status status_;
};
// fsync of a directory: makes the renames and creations inside it durable.
Status SyncDir(const std::string& path, const char* failpoint = "fs.sync_dir");
Status Rename(const std::string& from, const std::string& to, const char* failpoint = "fs.rename");
Status RemoveTree(const std::string& path);
Result<std::vector<std::string>> ListDir(const std::string& path);
// A file's size (links followed); a directory, FIFO or socket is refused as OpenFileNotFifo
// refuses it (a directory where a data file should be read as "4096 bytes, truncated").
Result<uint64_t> FileSize(const std::string& path);
// open(2) of a file the library reads or writes in place, refusing, by name and without waiting,
// a FIFO (where a checkpoint's file should be, it blocked open() for good: O_NONBLOCK while
// opening, cleared after), a socket or a directory. Devices pass: /dev/null is a sink tests
// write to, and one read as a checkpoint file fails on its size or contents. O_CLOEXEC is added;
// `mode` is for O_CREAT. `open_errno`, when given, gets open's errno (0 when the open itself
// succeeded).
Result<int> OpenFileNotFifo(const std::string& path, int flags, mode_t mode = 0644, int* open_errno = nullptr);

// The most one pread/pwrite (or io_uring request) carries: below the 32-bit length of an SQE and
// Linux's 2 GiB per-call cap, and a multiple of the O_DIRECT alignment so every piece stays aligned.
inline constexpr size_t kMaxTransferBytes = size_t{1} << 30;

// The library's one pread/pwrite loop: exactly `length` bytes at `offset` of the open `fd` of
// `path`, in calls of at most kMaxTransferBytes. EINTR and EAGAIN are retried (a signal is no
// fault of the file), short transfers resumed; a read that meets end of file is DataLoss naming
// the file and the offset, a write that moves nothing is EIO. Errors read as the IoEngine's.
Status ReadFullyAt(int fd, void* buffer, size_t length, uint64_t offset, const std::string& path);
Status WriteFullyAt(int fd, const void* buffer, size_t length, uint64_t offset, const std::string& path);
// The same loop with `after_each` seeing every transfer of *moved bytes: it may fail it or lower
// *moved (the IoEngine's completion failpoints and short-transfer simulation).
Status TransferFullyAt(bool write, int fd, void* buffer, size_t length, uint64_t offset,
                       const std::string& path, const std::function<Status(size_t* moved)>& after_each);
// The messages of that loop, for the io_uring engine's own completions.
Status TransferError(bool write, const std::string& path, uint64_t offset, size_t length, int err);
Status UnexpectedEndOfFile(const std::string& path, uint64_t at);

// Reads a whole file, refusing files larger than max_bytes before allocating anything. With
// `prefer_direct`, O_DIRECT where the file system takes it (direct_io.h): for a file written that
// way (WriteFileDurably), which is not in the page cache, that is the fast read (a 2.6 MB
// manifest here: 2.6 ms, where a buffered read of it took 3-16 ms).
Result<std::string> ReadFileLimited(const std::string& path, uint64_t max_bytes, bool prefer_direct = false);
// Writes `bytes` to `path` durably and atomically: temp file in the same folder, fsync, rename,
// fsync of the folder. Readers see the old contents or the new, never a mix.
Status WriteFileAtomic(const std::string& path, const std::string& bytes,
                       const char* failpoint_prefix);
// WriteFileAtomic in two halves, for a caller that overlaps the temp file's fsync with other
// work (the commit writes `latest`'s while its manifest is written): PrepareFileAtomic leaves
// `path`.tmp written and fsynced (failpoints `.write`, `.fsync`), PublishPreparedFile renames it
// over `path` and fsyncs the folder (`.rename`, `.sync_dir`). A prepared file never published is
// removed with DiscardPreparedFile; one a crash leaves behind is replaced by the next prepare.
Status PrepareFileAtomic(const std::string& path, const std::string& bytes, const char* failpoint_prefix);
Status PublishPreparedFile(const std::string& path, const char* failpoint_prefix);
void DiscardPreparedFile(const std::string& path);
// Creates (or truncates) `path`, writes `pieces` one after the other and fdatasyncs it, with
// O_DIRECT where the file system takes it. Not atomic: for a file in a folder not yet published,
// whose own fsync and rename publish it (the commit's manifest). Why O_DIRECT: new page-cache
// pages are slow to get; a 2.6 MB manifest written through the page cache took 7 ms plus 2 ms of
// fsync on this project's test VM, with O_DIRECT 1.6-2.3 ms plus 0.4 ms. The bytes pass through
// `*staging`, reallocated only when too small, so a caller that keeps it (a job's repeat saves)
// stages in warm memory; nullptr stages in memory of this call's own. The failpoints
// `<failpoint_prefix>.write` and `.fsync` fire before those steps, as in WriteFileAtomic.
Status WriteFileDurably(const std::string& path, const std::vector<std::string_view>& pieces,
                        AlignedBuffer* staging, const char* failpoint_prefix);

}  // namespace shardckpt
