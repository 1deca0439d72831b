#include "shardckpt/io/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "shardckpt/io/checksum.h"  // AlignUp
#include "shardckpt/io/direct_io.h"
#include "shardckpt/io/failpoint.h"

namespace shardckpt {

Status TransferError(bool write, const std::string& path, uint64_t offset, size_t length, int err) {
  return ErrnoStatus(err, std::string(write ? "write " : "read ") + path + " at offset " + std::to_string(offset) +
                              " length " + std::to_string(length));
}

Status UnexpectedEndOfFile(const std::string& path, uint64_t at) {
  return DataLoss("read " + path + ": unexpected end of file at offset " + std::to_string(at) + " (file truncated?)");
}

Status TransferFullyAt(bool write, int fd, void* buffer, size_t length, uint64_t offset,
                       const std::string& path, const std::function<Status(size_t* moved)>& after_each) {
  auto* bytes = static_cast<unsigned char*>(buffer);
  size_t done = 0;
  while (done < length) {
    const size_t want = std::min(length - done, kMaxTransferBytes);
    const auto at = static_cast<off_t>(offset + done);
    ssize_t n = write ? ::pwrite(fd, bytes + done, want, at) : ::pread(fd, bytes + done, want, at);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return TransferError(write, path, offset, length, errno);
    if (n == 0) return write ? TransferError(write, path, offset, length, EIO) : UnexpectedEndOfFile(path, offset + done);
    size_t moved = static_cast<size_t>(n);
    if (after_each) SC_RETURN_IF_ERROR(after_each(&moved));
    done += moved;
  }
  return Status::Ok();
}

Status ReadFullyAt(int fd, void* buffer, size_t length, uint64_t offset, const std::string& path) {
  return TransferFullyAt(false, fd, buffer, length, offset, path, nullptr);
}

Status WriteFullyAt(int fd, const void* buffer, size_t length, uint64_t offset, const std::string& path) {
  return TransferFullyAt(true, fd, const_cast<void*>(buffer), length, offset, path, nullptr);
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsPlainNonFolder(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return false;
  if (!S_ISLNK(st.st_mode)) return true;
  return ::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);  // a link to a file; a dangling one is none
}

bool IsDanglingLink(const std::string& path, int* error) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return false;
  if (::stat(path.c_str(), &st) == 0) return false;
  if (error != nullptr) *error = errno;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

Status MakeDir(const std::string& path) {
  SC_RETURN_IF_ERROR(Failpoint("fs.mkdir", "mkdir " + path));
  if (::mkdir(path.c_str(), 0755) != 0) return ErrnoStatus(errno, "mkdir " + path);
  return Status::Ok();
}

std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Each directory it creates is made durable in its parent (fsync of the parent), so a crash
// after a first save commits cannot lose the new root, and with it the checkpoint.
Status MakeDirs(const std::string& path) {
  const std::string trimmed = WithoutTrailingSlashes(path);
  if (trimmed.empty() || IsDirectory(trimmed)) return Status::Ok();
  const std::string parent = DirName(trimmed);
  if (parent != trimmed) SC_RETURN_IF_ERROR(MakeDirs(parent));
  if (::mkdir(trimmed.c_str(), 0755) != 0) {
    if (errno == EEXIST && IsDirectory(trimmed)) return Status::Ok();  // another process made it
    if (errno == EEXIST) return ErrnoStatus(ENOTDIR, "mkdir " + trimmed + ": exists and is not a directory");
    return ErrnoStatus(errno, "mkdir " + trimmed);
  }
  return SyncDir(parent, "fs.mkdirs.sync_parent");
}

MadeDirs::MadeDirs(const std::string& path) {
  // Lexically normal first: rmdir of "a/." or "c/.." fails, and the folders above would stay.
  const std::string normal = std::filesystem::path(path).lexically_normal().string();
  std::string at = WithoutTrailingSlashes(normal);
  while (!at.empty() && !PathExists(at)) {
    made_.push_back(at);
    const std::string parent = DirName(at);
    if (parent == at) break;
    at = parent;
  }
  status_ = MakeDirs(normal);  // the folders listed, no others ("x/y/../z" makes no x/y)
}

MadeDirs::~MadeDirs() {
  for (const std::string& dir : made_) {
    if (::rmdir(dir.c_str()) != 0) break;  // not empty (or gone): it, and those above it, stay
  }
}

Status SyncDir(const std::string& path, const char* failpoint) {
  SC_RETURN_IF_ERROR(Failpoint(failpoint, "fsync directory " + path));
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open directory " + path);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, "fsync directory " + path);
  return Status::Ok();
}

Status Rename(const std::string& from, const std::string& to, const char* failpoint) {
  SC_RETURN_IF_ERROR(Failpoint(failpoint, "rename " + from + " -> " + to));
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, "rename " + from + " -> " + to);
  }
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "remove " + path);
  return Status::Ok();
}

Result<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, "opendir " + path);
  std::vector<std::string> names;
  while (struct dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

namespace {

// What OpenFileNotFifo refuses, named; nullptr for what it opens (regular files, devices).
const char* RefusedKind(mode_t mode) {
  return S_ISFIFO(mode) ? "a FIFO" : S_ISDIR(mode) ? "a directory" : S_ISSOCK(mode) ? "a socket" : nullptr;
}

Status NotARegularFile(const std::string& path, const char* kind) {
  return FailedPrecondition(path + " is not a regular file (" + kind + ")");
}

}  // namespace

Result<int> OpenFileNotFifo(const std::string& path, int flags, mode_t mode, int* open_errno) {
  int fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC, mode);
  int err = fd < 0 ? errno : 0;
  struct stat st;
  if ((err == EAGAIN || err == EWOULDBLOCK) && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    // A regular file under a lease (an NFS delegation, a Samba oplock): O_NONBLOCK refuses to
    // wait for the lease break, which a plain open does.
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    err = fd < 0 ? errno : 0;
  }
  if (open_errno != nullptr) *open_errno = err;
  if (fd < 0) {
    // ENXIO: a FIFO with no reader opened to write without blocking, or a socket.
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && RefusedKind(st.st_mode) != nullptr) {
      return NotARegularFile(path, RefusedKind(st.st_mode));
    }
    return ErrnoStatus(err, "open " + path);
  }
  Status refused;
  if (::fstat(fd, &st) != 0) {
    err = errno;  // before the message is built
    refused = ErrnoStatus(err, "fstat " + path);
  } else if (RefusedKind(st.st_mode) != nullptr) {
    refused = NotARegularFile(path, RefusedKind(st.st_mode));
  } else if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    err = errno;
    refused = ErrnoStatus(err, "fcntl " + path);
  }
  if (refused.ok()) return fd;
  ::close(fd);
  return refused;
}

Result<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (RefusedKind(st.st_mode) != nullptr) return NotARegularFile(path, RefusedKind(st.st_mode));
  return static_cast<uint64_t>(st.st_size);
}

namespace {

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// O_DIRECT reads whole blocks into aligned memory: the string is read into at its first aligned
// byte, `size` rounded up (the read stops at end of file), and the bytes are then moved to its
// front, within it. One buffer of fresh memory, not an aligned one and a string copied from it:
// faulting fresh memory in is what such a read spends most on here; the move runs in cache.
Result<std::string> ReadDirect(int fd, uint64_t size, const std::string& path) {
  const size_t padded = AlignUp(size, kDirectIoAlignment);
  std::string bytes(padded + kDirectIoAlignment, '\0');
  const size_t skip = AlignUp(reinterpret_cast<uintptr_t>(bytes.data()), kDirectIoAlignment) -
                      reinterpret_cast<uintptr_t>(bytes.data());
  char* const into = bytes.data() + skip;
  size_t done = 0;
  while (done < size) {
    if (done % kDirectIoAlignment != 0) {
      // A short read that was not the end of the file: the rest without O_DIRECT, which demands
      // aligned offsets.
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return ErrnoStatus(errno, "fcntl " + path);
      SC_RETURN_IF_ERROR(ReadFullyAt(fd, into + done, size - done, done, path));
      break;
    }
    const ssize_t n = ::pread(fd, into + done, padded - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return TransferError(false, path, done, padded - done, errno);
    }
    if (n == 0) return UnexpectedEndOfFile(path, done);
    done += static_cast<size_t>(n);
  }
  bytes.erase(0, skip);
  bytes.resize(size);
  return bytes;
}

}  // namespace

Result<std::string> ReadFileLimited(const std::string& path, uint64_t max_bytes, bool prefer_direct) {
  bool direct = false;
  SC_ASSIGN_OR_RETURN(int fd, OpenPreferDirect(path, O_RDONLY, prefer_direct, &direct));
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Status(Code::kInvalidArgument,
                  path + " is " + std::to_string(size) + " bytes, over the limit of " + std::to_string(max_bytes));
  }
  if (direct) return ReadDirect(fd, size, path);
  std::string bytes(static_cast<size_t>(size), '\0');
  SC_RETURN_IF_ERROR(ReadFullyAt(fd, bytes.data(), bytes.size(), 0, path));
  return bytes;
}

namespace {

// Creates (or truncates) `path`, writes `pieces` one after the other and fdatasyncs it; with
// `prefer_direct`, O_DIRECT through `staging` where the file system takes it.
Status WriteAndSync(const std::string& path, const std::vector<std::string_view>& pieces, bool prefer_direct,
                    AlignedBuffer* staging, const std::string& failpoint_prefix, int extra_flags = 0) {
  SC_RETURN_IF_ERROR(Failpoint((failpoint_prefix + ".write").c_str(), "write " + path));
  size_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  bool direct = false;
  SC_ASSIGN_OR_RETURN(int fd,
                      OpenPreferDirect(path, O_WRONLY | O_CREAT | O_TRUNC | extra_flags, prefer_direct && size != 0, &direct));
  FdCloser closer(fd);
  if (direct) {
    const size_t padded = AlignUp(size, kDirectIoAlignment);
    // A caller that keeps its staging (a job's repeat saves) gets the default memory, on huge
    // pages, faulted once; this call's own is used once (OneOffHostAllocator, aligned_buffer.h).
    AlignedBuffer local;
    Status room = Status::Ok();
    if (staging == nullptr) {
      Result<AlignedBuffer> made = AlignedBuffer::Allocate(padded, OneOffHostAllocator());
      if (made.ok()) local = std::move(*made);
      room = made.status();
      staging = &local;
    } else {
      room = EnsureAlignedBytes(staging, padded);
    }
    if (!room.ok()) return room.WithContext("write " + path);
    unsigned char* at = staging->data();
    for (std::string_view piece : pieces) {
      if (piece.empty()) continue;  // its data() may be null, which memcpy may not be given
      std::memcpy(at, piece.data(), piece.size());
      at += piece.size();
    }
    std::memset(at, 0, padded - size);
    SC_RETURN_IF_ERROR(WriteFullyAt(fd, staging->data(), padded, 0, path));
    if (padded != size && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, "truncate " + path + " to " + std::to_string(size) + " bytes");
    }
  } else {
    uint64_t offset = 0;
    for (std::string_view piece : pieces) {
      SC_RETURN_IF_ERROR(WriteFullyAt(fd, piece.data(), piece.size(), offset, path));
      offset += piece.size();
    }
  }
  SC_RETURN_IF_ERROR(Failpoint((failpoint_prefix + ".fsync").c_str(), "fsync " + path));
  // The file's size is metadata fdatasync writes too: a truncation is durable with the bytes.
  if (::fdatasync(fd) != 0) return ErrnoStatus(errno, "fsync " + path);
  return Status::Ok();
}

}  // namespace

Status PrepareFileAtomic(const std::string& path, const std::string& bytes, const char* failpoint_prefix) {
  const std::string temp = path + ".tmp";
  // A fresh file, never one found there: a symlink planted at ROOT/latest.tmp made a save write
  // `latest` into its target, outside the root, and rename the link into place. A stale temp
  // file (a writer that died) is removed first; a folder there stays, and the open names it.
  if (::unlink(temp.c_str()) != 0 && errno != ENOENT) {
    if (errno == EISDIR) return FailedPrecondition(temp + " is a folder, where " + path + " is written first: remove it");
    // Not removable (a read-only file system, no write permission): the create below says why.
    if (errno != EROFS && errno != EACCES && errno != EPERM) return ErrnoStatus(errno, "remove the stale " + temp);
  }
  // Small files (`latest`) through the page cache: no staging to allocate for a few bytes.
  Status status = WriteAndSync(temp, {bytes}, /*prefer_direct=*/false, nullptr, failpoint_prefix, O_EXCL | O_NOFOLLOW);
  if (!status.ok()) DiscardPreparedFile(path);
  return status;
}

Status PublishPreparedFile(const std::string& path, const char* failpoint_prefix) {
  const std::string prefix = failpoint_prefix;
  Status status = Rename(path + ".tmp", path, (prefix + ".rename").c_str());
  if (!status.ok()) {
    DiscardPreparedFile(path);
    return status;
  }
  return SyncDir(DirName(path), (prefix + ".sync_dir").c_str());
}

void DiscardPreparedFile(const std::string& path) { ::unlink((path + ".tmp").c_str()); }

Status WriteFileAtomic(const std::string& path, const std::string& bytes, const char* failpoint_prefix) {
  SC_RETURN_IF_ERROR(PrepareFileAtomic(path, bytes, failpoint_prefix));
  return PublishPreparedFile(path, failpoint_prefix);
}

Status WriteFileDurably(const std::string& path, const std::vector<std::string_view>& pieces,
                        AlignedBuffer* staging, const char* failpoint_prefix) {
  return WriteAndSync(path, pieces, /*prefer_direct=*/true, staging, failpoint_prefix);
}

}  // namespace shardckpt
