#include "shardckpt/engine/formats/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {
constexpr size_t kBufferBytes = 8u << 20;
}  // namespace

Result<std::unique_ptr<OutputFile>> OutputFile::Create(const std::string& path) {
  std::unique_ptr<OutputFile> out(new OutputFile());
  out->path_ = path;
  out->temp_ = path + ".partial";
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  out->fd_ = ::open(out->temp_.c_str(), flags | O_DIRECT, 0644);
  out->direct_ = out->fd_ >= 0;
  if (out->fd_ < 0) out->fd_ = ::open(out->temp_.c_str(), flags, 0644);  // no O_DIRECT here (tmpfs)
  if (out->fd_ < 0) return ErrnoStatus(errno, "create " + out->temp_);
  SC_ASSIGN_OR_RETURN(out->buffer_, AlignedBuffer::Allocate(kBufferBytes));
  out->sha_ = EVP_MD_CTX_new();
  EVP_DigestInit_ex(out->sha_, EVP_sha256(), nullptr);
  return out;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());  // not closed: an abandoned export
  }
  if (sha_ != nullptr) EVP_MD_CTX_free(sha_);
}

Status OutputFile::Flush() {
  // Direct writes need whole blocks: a partial tail is zero-padded here and cut off by the
  // ftruncate in Close (Flush with a partial buffer happens only there).
  size_t length = direct_ ? AlignUp(fill_, kDirectIoAlignment) : fill_;
  std::memset(buffer_.data() + fill_, 0, length - fill_);
  const uint64_t at = position_ - fill_;
  size_t done = 0;
  while (done < length) {
    ssize_t n = ::pwrite(fd_, buffer_.data() + done, length - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "write " + temp_);
    done += static_cast<size_t>(n);
  }
  fill_ = 0;
  return Status::Ok();
}

Status OutputFile::Write(const void* data, size_t bytes) {
  EVP_DigestUpdate(sha_, data, bytes);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    size_t n = std::min(bytes, kBufferBytes - fill_);
    std::memcpy(buffer_.data() + fill_, p, n);
    fill_ += n;
    position_ += n;
    p += n;
    bytes -= n;
    if (fill_ == kBufferBytes) SC_RETURN_IF_ERROR(Flush());
  }
  return Status::Ok();
}

Status OutputFile::Close() {
  SC_RETURN_IF_ERROR(Flush());
  if (::ftruncate(fd_, static_cast<off_t>(position_)) != 0) return ErrnoStatus(errno, "truncate " + temp_);
  if (::fsync(fd_) != 0) return ErrnoStatus(errno, "fsync " + temp_);
  ::close(fd_);
  fd_ = -1;
  SC_RETURN_IF_ERROR(Rename(temp_, path_));
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_DigestFinal_ex(sha_, digest, &length);
  static const char* kHex = "0123456789abcdef";
  sha256_.clear();
  for (unsigned i = 0; i < length; ++i) {
    sha256_ += kHex[digest[i] >> 4];
    sha256_ += kHex[digest[i] & 15];
  }
  return WriteFileAtomic(path_ + ".sha256", sha256_ + "  " + BaseName(path_) + "\n", "export.sha256");
}

}  // namespace shardckpt
