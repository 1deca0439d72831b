#include "shardckpt/engine/formats/zip_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

uint64_t Le(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

}  // namespace

struct ByteSource::Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Result<ByteSource> ByteSource::OpenFile(const std::string& path) {
  ByteSource s;
  s.name_ = path;
  auto fd = std::make_shared<Fd>();
  SC_ASSIGN_OR_RETURN(fd->fd, OpenFileNotFifo(path, O_RDONLY));
  SC_ASSIGN_OR_RETURN(s.size_, FileSize(path));
  s.fd_ = std::move(fd);
  return s;
}

ByteSource ByteSource::FromBytes(std::string bytes, const std::string& name) {
  ByteSource s;
  s.name_ = name;
  s.size_ = bytes.size();
  s.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  return s;
}

Status ByteSource::ReadAt(uint64_t offset, void* buffer, size_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return DataLoss(name_ + ": read of " + std::to_string(bytes) + " bytes at " + std::to_string(offset) +
                    " runs past the end of the file (" + std::to_string(size_) + " bytes): truncated?");
  }
  if (bytes_) {
    if (bytes > 0) std::memcpy(buffer, bytes_->data() + base_ + offset, bytes);
    return Status::Ok();
  }
  return ReadFullyAt(fd_->fd, buffer, bytes, base_ + offset, name_);
}

Status ReadAheadWindow::ReadAt(uint64_t offset, void* buffer, size_t bytes) {
  if (offset >= start_ && offset - start_ <= held_.size() && bytes <= held_.size() - (offset - start_)) {
    if (bytes > 0) std::memcpy(buffer, held_.data() + (offset - start_), bytes);
    return Status::Ok();
  }
  // Past the end: the source's own refusal names the read.
  if (bytes > window_ / 2 || offset < start_ || offset >= source_.size() || bytes > source_.size() - offset) {
    return source_.ReadAt(offset, buffer, bytes);
  }
  held_.resize(static_cast<size_t>(std::min<uint64_t>(window_, source_.size() - offset)));
  if (Status read = source_.ReadAt(offset, held_.data(), held_.size()); !read.ok()) {
    held_.clear();
    return read;
  }
  start_ = offset;
  if (bytes > 0) std::memcpy(buffer, held_.data(), bytes);
  return Status::Ok();
}

Result<ByteSource> ByteSource::Slice(uint64_t offset, uint64_t size, const std::string& name) const {
  if (offset > size_ || size > size_ - offset) {
    return DataLoss("bytes [" + std::to_string(offset) + ", +" + std::to_string(size) + ") run past the end of " +
                    name_ + " (" + std::to_string(size_) + " bytes): truncated?");
  }
  ByteSource s = *this;
  s.name_ = name;
  s.base_ = base_ + offset;
  s.size_ = size;
  return s;
}

Result<ZipReader> ZipReader::Open(const std::string& path) {
  SC_ASSIGN_OR_RETURN(ByteSource source, ByteSource::OpenFile(path));
  return Open(std::move(source));
}

Result<ZipReader> ZipReader::Open(ByteSource source) {
  ZipReader z(std::move(source));
  const std::string& path = z.path();
  const uint64_t size = z.file_size();
  auto bad = [&](const std::string& what) { return DataLoss(path + ": not a valid torch.save zip: " + what); };
  // torch.save before 1.6 (or with _use_new_zipfile_serialization=False) wrote a pickled magic
  // number and raw storages, no zip: a valid file in a format this reader does not take
  // (torch_file.h's ReadLegacyTorchFile does).
  static const unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                               0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  unsigned char head[sizeof(kLegacyMagic)];
  if (size >= sizeof(head) && z.ReadAt(0, head, sizeof(head)).ok() && !std::memcmp(head, kLegacyMagic, sizeof(head))) {
    return Status(Code::kUnimplemented, path + ": a legacy (pre-1.6, non-zip) torch.save file, not a zip (import reads "
                                               "it through ReadLegacyTorchFile; torch.save it again for the zip format)");
  }
  if (size < 22) return bad("too short");
  // End of central directory: in the last 22 + 65535 bytes. torch.save writes no zip comment,
  // so it is the last 22 (after a zip64 locator's 20): those are read alone first, which keeps
  // opening one embedded zip per chunk of a DCP folder cheap; a comment sends the search back.
  uint64_t tail = std::min<uint64_t>(size, 22 + 20);
  std::string buf;
  long eocd = -1;
  for (int attempt = 0; attempt < 2 && eocd < 0; ++attempt) {
    if (attempt == 1) tail = std::min<uint64_t>(size, 22 + 65535);
    buf.assign(tail, '\0');
    SC_RETURN_IF_ERROR(z.ReadAt(size - tail, buf.data(), tail));
    const auto* p = reinterpret_cast<const unsigned char*>(buf.data());
    for (long i = static_cast<long>(tail) - 22; i >= 0; --i) {
      if (Le(p + i, 4) == 0x06054b50) {
        eocd = i;
        break;
      }
    }
  }
  const auto* b = reinterpret_cast<const unsigned char*>(buf.data());
  if (eocd < 0) return bad("no end-of-central-directory record");
  uint64_t count = Le(b + eocd + 10, 2), dir_size = Le(b + eocd + 12, 4), dir_offset = Le(b + eocd + 16, 4);
  if (count == 0xFFFF || dir_size == 0xFFFFFFFF || dir_offset == 0xFFFFFFFF) {
    if (eocd < 20 || Le(b + eocd - 20, 4) != 0x07064b50) return bad("zip64 locator missing");
    uint64_t z64 = Le(b + eocd - 20 + 8, 8);
    unsigned char rec[56];
    SC_RETURN_IF_ERROR(z.ReadAt(z64, rec, sizeof(rec)));
    if (Le(rec, 4) != 0x06064b50) return bad("zip64 end record missing");
    count = Le(rec + 32, 8);
    dir_size = Le(rec + 40, 8);
    dir_offset = Le(rec + 48, 8);
  }
  if (dir_offset > size || dir_size > size - dir_offset || dir_size > (256u << 20) || count > dir_size / 46 + 1) {
    return bad("central directory out of bounds");
  }
  std::string dir(dir_size, '\0');
  SC_RETURN_IF_ERROR(z.ReadAt(dir_offset, dir.data(), dir_size));
  const auto* d = reinterpret_cast<const unsigned char*>(dir.data());
  uint64_t at = 0;
  for (uint64_t k = 0; k < count; ++k) {
    if (at + 46 > dir_size || Le(d + at, 4) != 0x02014b50) return bad("broken central directory entry " + std::to_string(k));
    uint64_t method = Le(d + at + 10, 2);
    uint64_t csize = Le(d + at + 20, 4), usize = Le(d + at + 24, 4);
    uint64_t name_len = Le(d + at + 28, 2), extra_len = Le(d + at + 30, 2), comment_len = Le(d + at + 32, 2);
    uint64_t header = Le(d + at + 42, 4);
    if (at + 46 + name_len + extra_len + comment_len > dir_size) return bad("central directory entry runs past its end");
    std::string name(dir.data() + at + 46, name_len);
    // zip64 extra: the 0xFFFFFFFF fields, in order usize, csize, offset.
    const uint64_t extra_end = at + 46 + name_len + extra_len;
    for (uint64_t e = at + 46 + name_len; e + 4 <= extra_end;) {
      uint64_t id = Le(d + e, 2), len = Le(d + e + 2, 2);
      // Its fields are read up to the length it states: that length must stay inside the entry
      // (the last entry's extra ends the directory buffer).
      if (e + 4 + len > extra_end) return bad("record '" + name + "': an extra field runs past its entry");
      if (id == 1) {
        uint64_t p = e + 4;
        if (usize == 0xFFFFFFFF && p + 8 <= e + 4 + len) { usize = Le(d + p, 8); p += 8; }
        if (csize == 0xFFFFFFFF && p + 8 <= e + 4 + len) { csize = Le(d + p, 8); p += 8; }
        if (header == 0xFFFFFFFF && p + 8 <= e + 4 + len) { header = Le(d + p, 8); }
      }
      e += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0) {  // a valid zip (torch.load reads it), of a kind this reader does not take
      return Status(Code::kUnimplemented, path + ": record '" + name + "' is compressed (zip method " +
                                              std::to_string(method) +
                                              "); shardckpt reads the stored records torch.save writes (save it again with torch.save)");
    }
    if (csize != usize) return bad("record '" + name + "' sizes disagree");
    unsigned char local[30];
    SC_RETURN_IF_ERROR(z.ReadAt(header, local, sizeof(local)));
    if (Le(local, 4) != 0x04034b50) return bad("record '" + name + "' has no local header");
    uint64_t data = header + 30 + Le(local + 26, 2) + Le(local + 28, 2);
    if (data > size || usize > size - data) return bad("record '" + name + "' runs past the end of the file");
    // torch.load reads the first of two records of one name; taking either would be a guess.
    if (!z.records_.emplace(name, ZipRecord{data, usize}).second) return bad("record '" + name + "' occurs twice");
  }
  if (z.records_.empty()) return bad("no records");
  const std::string& first = z.records_.begin()->first;
  size_t slash = first.find('/');
  if (slash == std::string::npos) return bad("records are not under one top folder");
  z.prefix_ = first.substr(0, slash + 1);
  for (const auto& [name, record] : z.records_) {
    if (name.compare(0, z.prefix_.size(), z.prefix_) != 0) return bad("records under several top folders");
  }
  if (z.records_.count(z.prefix_ + "constants.pkl")) return bad("this is a TorchScript archive, not a torch.save file");
  return z;
}

Result<std::string> ZipReader::ReadRecord(const std::string& name, uint64_t max_bytes) const {
  auto it = records_.find(name);
  if (it == records_.end()) return NotFound(path() + ": no record '" + name + "'");
  if (it->second.size > max_bytes) return DataLoss(path() + ": record '" + name + "' is larger than " + std::to_string(max_bytes));
  std::string out(it->second.size, '\0');
  SC_RETURN_IF_ERROR(ReadAt(it->second.data_offset, out.data(), out.size()));
  return out;
}

}  // namespace shardckpt
