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
constexpr size_t kBuffers = 2;
constexpr size_t kBufferBytes = 4u << 20;
}  // namespace

Result<std::unique_ptr<OutputFile>> OutputFile::Create(const std::string& path) {
  std::unique_ptr<OutputFile> out(new OutputFile());
  out->path_ = path;
  out->temp_ = path + ".partial";
  IoOptions options;
  options.queue_depth = kBuffers;
  out->io_ = CreateIoEngine(options);
  SC_ASSIGN_OR_RETURN(out->pool_, BufferPool::Create(kBuffers, kBufferBytes));
  out->writer_ = std::make_unique<SequentialWriter>(out->io_.get(), out->pool_.get());
  SC_RETURN_IF_ERROR(out->writer_->Open(out->temp_));
  out->sha_ = EVP_MD_CTX_new();
  EVP_DigestInit_ex(out->sha_, EVP_sha256(), nullptr);
  return out;
}

OutputFile::~OutputFile() {
  if (writer_ != nullptr) {
    writer_.reset();
    ::unlink(temp_.c_str());  // not closed: an abandoned export
  }
  if (sha_ != nullptr) EVP_MD_CTX_free(sha_);
}

Status OutputFile::Write(const void* data, size_t bytes) {
  EVP_DigestUpdate(sha_, data, bytes);
  position_ += bytes;
  return writer_->Stage(data, bytes);
}

Status OutputFile::Close() {
  SC_RETURN_IF_ERROR(writer_->Finish(position_));
  writer_.reset();
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
