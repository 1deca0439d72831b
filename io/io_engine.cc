#include "shardckpt/io/io_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/direct_io.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Result<uint64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, "fstat " + path_);
  return static_cast<uint64_t>(st.st_size);
}

namespace {
std::atomic<uint64_t> g_usage[2][2];  // [io_uring][direct]

}  // namespace

Result<std::unique_ptr<File>> IoEngine::Open(const std::string& path, OpenMode mode) {
  const int flags = mode == OpenMode::kRead ? O_RDONLY : (O_WRONLY | O_CREAT | O_TRUNC);
  bool direct = false;
  SC_ASSIGN_OR_RETURN(int fd, OpenPreferDirect(path, flags, options_.use_direct, &direct));
  return std::make_unique<File>(fd, path, direct);
}

Status IoEngine::Drain() {
  Status first;
  while (in_flight() > 0) {
    const size_t before = in_flight();
    Result<uint64_t> tag = Reap();
    if (tag.ok()) continue;
    if (first.ok()) first = tag.status();
    // The wait itself failed and nothing came back (Reap already waited out a busy ring): waiting
    // again would spin for ever, and returning would let the owner free buffers the kernel may
    // still write into (memory corrupted where it was reused). Neither is safe to go on from.
    if (in_flight() == before) {
      SC_LOG(kError) << name() << " engine: " << in_flight() << " operation(s) in flight can no longer be waited for ("
                     << tag.status().ToString() << "); aborting rather than freeing memory the kernel may still "
                     << "write into";
      std::abort();
    }
  }
  return first;
}

Status IoEngine::Sync(File* file) {
  SC_RETURN_IF_ERROR(Failpoint("io.fsync", "fdatasync " + file->path()));
  if (::fdatasync(file->fd()) != 0) return ErrnoStatus(errno, "fdatasync " + file->path());
  return Status::Ok();
}

Status IoEngine::OpError(const File& file, const IoOp& op, int err) {
  return TransferError(op.kind == IoKind::kWrite, file.path(), op.offset, op.length, err);
}

Status IoEngine::NothingTransferred(const File& file, const IoOp& op, size_t done) {
  if (op.kind == IoKind::kWrite) return OpError(file, op, EIO);
  return UnexpectedEndOfFile(file.path(), op.offset + done);
}

Status IoEngine::CheckSubmit(const File& file, const IoOp& op) {
  const char* point = op.kind == IoKind::kRead ? "io.read" : "io.write";
  return Failpoint(point, std::string(op.kind == IoKind::kRead ? "read " : "write ") +
                              file.path() + " at offset " + std::to_string(op.offset));
}

Status IoEngine::Completed(const File& file, const IoOp& op, size_t* got, bool* cut_pending) {
  const char* point = op.kind == IoKind::kRead ? "io.read.complete" : "io.write.complete";
  std::string action = FailpointAction(point);
  if (int err = FailpointErrno(action); err != 0) {
    Status failed = OpError(file, op, err);
    return Status(failed.code(), failed.message() + " [injected at failpoint " + point + "]");
  }
  if ((action == "short" || *cut_pending) && *got > 1) {
    // The kernel stopped halfway: the bytes past the cut are transferred again.
    size_t cut = file.direct() ? AlignDown(*got / 2, kBlockSize) : *got / 2;
    if (cut > 0) *got = cut;
    *cut_pending = false;
  }
  g_usage[std::strcmp(name(), "io_uring") == 0][file.direct()]++;
  return Status::Ok();
}

IoUsage ProcessIoUsage() {
  IoUsage usage;
  usage.uring_direct = g_usage[1][1];
  usage.uring_buffered = g_usage[1][0];
  usage.posix_direct = g_usage[0][1];
  usage.posix_buffered = g_usage[0][0];
  return usage;
}

std::unique_ptr<IoEngine> CreateIoEngine(IoOptions options) {
  if (options.use_io_uring) {
    Result<std::unique_ptr<IoEngine>> engine = CreateUringEngine(options);
    if (engine.ok()) return std::move(engine).value();
    LogOnce(LogLevel::kWarn, "uring-refused",
            "io_uring unavailable (" + engine.status().message() + "); using pread/pwrite");
  }
  return CreatePosixEngine(options);
}

}  // namespace shardckpt
