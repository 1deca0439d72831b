// A streaming writer of the zip container torch.save uses (docs/format.md): records
// stored uncompressed, each record's data at an absolute offset divisible by 64 (so torch.load's
// mmap=True works), zip64 when a size or offset reaches 4 GiB or there are 65535 records.
//
// Streaming: a record's bytes arrive in pieces after its header, so the header carries the
// "data descriptor" flag (bit 3) and the CRC-32 and sizes follow the data; the central directory
// at the end holds them too, which is where torch (miniz), Python's zipfile and unzip read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/output_file.h"

namespace shardckpt {

class ZipWriter {
 public:
  // `base`: where the zip starts in `out` (a DCP .distcp file holds zips back to back); every
  // offset the zip records, and the 64-byte alignment of its data, are relative to it.
  explicit ZipWriter(OutputFile* out, uint64_t base = 0) : out_(out), base_(base) {}
  // `size` is the record's length, known in advance (it decides the zip64 form).
  Status BeginRecord(const std::string& name, uint64_t size);
  Status Append(const void* data, size_t bytes);
  Status EndRecord();
  Status AddRecord(const std::string& name, const std::string& bytes);
  // Writes the central directory and end records.
  Status Finish();

 private:
  struct Record {
    std::string name;
    uint64_t header_offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
    bool zip64 = false;
  };
  OutputFile* out_;
  uint64_t base_ = 0;
  std::vector<Record> records_;
  bool open_ = false;
};

}  // namespace shardckpt
