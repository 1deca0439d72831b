#include "engine/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "io/fs.h"

namespace shardckpt {
namespace {
constexpr size_t kBufferBytes = 8u << 20;
std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

Result<std::unique_ptr<OutputFile>> OutputFile::Create(const std::string& path) {
  std::unique_ptr<OutputFile> out(new OutputFile());
  out->path_ = path;
  out->temp_ = path + ".partial";
  out->fd_ = ::open(out->temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out->fd_ < 0) return ErrnoStatus(errno, "create " + out->temp_);
  out->buffer_.reserve(kBufferBytes);
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
  size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "write " + temp_);
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return Status::Ok();
}

Status OutputFile::Write(const void* data, size_t bytes) {
  EVP_DigestUpdate(sha_, data, bytes);
  position_ += bytes;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    size_t n = std::min(bytes, kBufferBytes - buffer_.size());
    buffer_.append(p, n);
    p += n;
    bytes -= n;
    if (buffer_.size() == kBufferBytes) SC_RETURN_IF_ERROR(Flush());
  }
  return Status::Ok();
}

Status OutputFile::Close() {
  SC_RETURN_IF_ERROR(Flush());
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
