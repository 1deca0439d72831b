// Reads the central directory of a zip (a torch.save file) and locates each stored record's
// bytes. Bounded: the directory size, record count and every offset are checked against the file
// size before anything is allocated; compressed records are refused (torch writes stored ones).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct ZipRecord {
  uint64_t data_offset = 0;
  uint64_t size = 0;
};

class ZipReader {
 public:
  static Result<ZipReader> Open(const std::string& path);
  const std::map<std::string, ZipRecord>& records() const { return records_; }
  // The single top folder all records live under ("archive/"), as torch.load requires.
  const std::string& prefix() const { return prefix_; }
  Result<std::string> ReadRecord(const std::string& name, uint64_t max_bytes) const;
  Status ReadAt(uint64_t offset, void* buffer, size_t bytes) const;
  uint64_t file_size() const { return size_; }

 private:
  std::string path_;
  uint64_t size_ = 0;
  std::string prefix_;
  std::map<std::string, ZipRecord> records_;
};

}  // namespace shardckpt
