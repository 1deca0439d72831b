// Reads the central directory of a zip (a torch.save file) and locates each stored record's
// bytes. Bounded: the directory size, record count and every offset are checked against the file
// size before anything is allocated; compressed records are refused (torch writes stored ones).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

// The bytes of an input file, read on demand with every read checked against the size; or the
// same over a buffer, so fuzz targets and tests drive the readers without touching the disk.
class ByteSource {
 public:
  static Result<ByteSource> OpenFile(const std::string& path);
  static ByteSource FromBytes(std::string bytes, const std::string& name);
  // `size` bytes of this source from `offset` (a zip embedded in a bigger file, as DCP writes),
  // checked against this source's size; reads past the slice are refused like reads past a file.
  Result<ByteSource> Slice(uint64_t offset, uint64_t size, const std::string& name) const;
  Status ReadAt(uint64_t offset, void* buffer, size_t bytes) const;
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  struct Fd;
  std::string name_;
  uint64_t size_ = 0;
  uint64_t base_ = 0;  // where a slice starts in the underlying file or bytes
  std::shared_ptr<const Fd> fd_;
  std::shared_ptr<const std::string> bytes_;
};

// Small reads of a source in file order (the tensors of a .pt, one after another) served from a
// window of it read `window` bytes at a time: an import of 100,000 tensors made 100,000 preads.
// A read wider than half the window, or one behind the window (out of file order), goes to the
// source itself, and every refill starts at the read that needs it, so reads in any order read at
// most about twice the file. Not thread-safe: one per reading loop.
class ReadAheadWindow {
 public:
  explicit ReadAheadWindow(const ByteSource& source, size_t window = size_t{1} << 20) : source_(source), window_(window) {}
  Status ReadAt(uint64_t offset, void* buffer, size_t bytes);

 private:
  const ByteSource& source_;
  size_t window_;
  std::vector<unsigned char> held_;
  uint64_t start_ = 0;  // the file offset of held_[0]
};

struct ZipRecord {
  uint64_t data_offset = 0;
  uint64_t size = 0;
};

class ZipReader {
 public:
  static Result<ZipReader> Open(const std::string& path);
  static Result<ZipReader> Open(ByteSource source);
  const std::map<std::string, ZipRecord, std::less<>>& records() const { return records_; }
  // The record of that name, or null (found without building a string).
  const ZipRecord* Find(std::string_view name) const {
    auto it = records_.find(name);
    return it == records_.end() ? nullptr : &it->second;
  }
  // The single top folder all records live under ("archive/"), as torch.load requires.
  const std::string& prefix() const { return prefix_; }
  Result<std::string> ReadRecord(const std::string& name, uint64_t max_bytes) const;
  Status ReadAt(uint64_t offset, void* buffer, size_t bytes) const { return source_.ReadAt(offset, buffer, bytes); }
  const ByteSource& source() const { return source_; }
  uint64_t file_size() const { return source_.size(); }
  const std::string& path() const { return source_.name(); }

 private:
  explicit ZipReader(ByteSource source) : source_(std::move(source)) {}
  ByteSource source_;
  std::string prefix_;
  std::map<std::string, ZipRecord, std::less<>> records_;
};

}  // namespace shardckpt
