// The file I/O stack under every save and load.
//
// An IoEngine runs positioned reads and writes on open files with up to queue_depth() operations
// in flight. Two implementations share this contract and one conformance suite
// (tests/io_engine_test.cc):
//   * io_uring: each Submit enters the kernel at once with that one request (no batching: a
//     request is never left waiting in the ring for a later call); completions are reaped one
//     at a time. A request of any length is sent in pieces of at most kMaxTransferBytes.
//   * posix: pread/pwrite, run at Submit time. It is chosen automatically, and logged once, when
//     io_uring cannot be set up (seccomp in containers, io_uring_disabled sysctl, old kernels).
// Both open files with O_DIRECT when asked and fall back to buffered I/O, logged once, where the
// file system refuses it (tmpfs on older kernels, some FUSE and network file systems).
//
// Error handling: an operation's failure comes back from Reap() as a Status naming the file,
// the offset and errno. Short transfers and EAGAIN/EINTR are not errors: the remainder is
// resubmitted until the operation is complete. A read that meets end-of-file before its length is
// DataLoss (a truncated file), never a silently short buffer. The failpoints io.read/io.write
// fire at submission, io.read.complete/io.write.complete at each completion (an errno, or
// `short`), io.uring_submit where io_uring_submit would fail and io.uring_wait where
// io_uring_wait_cqe would (nothing reaped).
//
// Lifecycle: buffers handed to Submit must stay valid until their tag comes back from Reap() or
// Drain() returns. Destroying an engine with operations in flight waits for them first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shardckpt/io/direct_io.h"  // IsMemoryBacked, OpenPreferDirect
#include "shardckpt/io/fs.h"  // kMaxTransferBytes, the pread/pwrite loop
#include "shardckpt/io/status.h"

namespace shardckpt {

struct IoOptions {
  size_t queue_depth = 32;
  bool use_io_uring = true;
  bool use_direct = true;
  // Test hook: the first completion of every operation is cut to half its length, so the
  // resubmission path runs on every request, on both engines.
  bool simulate_short_transfers = false;
};

enum class IoKind { kRead, kWrite };

struct IoOp {
  IoKind kind = IoKind::kRead;
  uint64_t offset = 0;
  void* buffer = nullptr;
  size_t length = 0;
};

enum class OpenMode { kRead, kCreate };

class File {
 public:
  File(int fd, std::string path, bool direct) : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  Result<uint64_t> Size() const;

 private:
  int fd_;
  std::string path_;
  bool direct_;
};

class IoEngine {
 public:
  explicit IoEngine(IoOptions options) : options_(options) {}
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;

  const IoOptions& options() const { return options_; }
  size_t queue_depth() const { return options_.queue_depth; }
  virtual size_t in_flight() const = 0;

  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode);
  // Queues `op`; the caller keeps in_flight() below queue_depth() by reaping.
  virtual Status Submit(File* file, const IoOp& op, uint64_t tag) = 0;
  // Waits for one operation to finish completely and returns its tag.
  virtual Result<uint64_t> Reap() = 0;
  // Reaps everything in flight; returns the first error and still waits for the rest. Where the
  // wait itself fails (a broken ring; a busy one is waited out for about a second) the process
  // aborts, logged as an error: spinning would hang it, and returning would free buffers the
  // kernel may still write into.
  Status Drain();
  // fdatasync: data and the size needed to read it back.
  Status Sync(File* file);

 protected:
  // Shared by both engines so their messages read the same.
  static Status OpError(const File& file, const IoOp& op, int err);
  static Status CheckSubmit(const File& file, const IoOp& op);
  // A transfer that moved no byte after `done`: end of file for a read, EIO for a write.
  static Status NothingTransferred(const File& file, const IoOp& op, size_t done);
  // Every transfer of `*got` bytes the kernel completed for `op` passes here: the completion
  // failpoints fail it or cut `*got` in half, as does simulate_short_transfers once per operation
  // (`*cut_pending`); then it is counted in ProcessIoUsage().
  Status Completed(const File& file, const IoOp& op, size_t* got, bool* cut_pending);

  IoOptions options_;
};

// What this process's engines did, so a test can tell the main path from a fallback: transfers
// completed, per engine and per open mode (O_DIRECT or buffered).
struct IoUsage {
  uint64_t uring_direct = 0;
  uint64_t uring_buffered = 0;
  uint64_t posix_direct = 0;
  uint64_t posix_buffered = 0;
};
IoUsage ProcessIoUsage();

std::unique_ptr<IoEngine> CreatePosixEngine(IoOptions options);
Result<std::unique_ptr<IoEngine>> CreateUringEngine(IoOptions options);
// io_uring when options allow and the kernel agrees, else posix (logged once per process).
std::unique_ptr<IoEngine> CreateIoEngine(IoOptions options = {});

}  // namespace shardckpt
