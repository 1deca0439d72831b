#include "shardckpt/engine/formats/zip_writer.h"

#include <libdeflate.h>

namespace shardckpt {
namespace {

constexpr uint64_t kAlignment = 64;
constexpr uint32_t kMax32 = 0xFFFFFFFFu;

void Put16(std::string& s, uint16_t v) {
  const char bytes[2] = {static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)};
  s.append(bytes, 2);
}
void Put32(std::string& s, uint32_t v) {
  Put16(s, static_cast<uint16_t>(v & 0xFFFF));
  Put16(s, static_cast<uint16_t>(v >> 16));
}
void Put64(std::string& s, uint64_t v) {
  Put32(s, static_cast<uint32_t>(v & kMax32));
  Put32(s, static_cast<uint32_t>(v >> 32));
}

}  // namespace

Status ZipWriter::BeginRecord(const std::string& name, uint64_t size) {
  if (open_) return Internal("zip: record still open");
  Record record{name, out_->position() - base_, 0, 0, false};
  record.zip64 = size >= kMax32 || record.header_offset >= kMax32;
  std::string zip64_extra;
  if (record.zip64) {  // sizes are in the descriptor; the extra marks the entry as zip64
    Put16(zip64_extra, 0x0001);
    Put16(zip64_extra, 16);
    Put64(zip64_extra, 0);
    Put64(zip64_extra, 0);
  }
  std::string header;
  header.reserve(30 + name.size() + zip64_extra.size() + 4 + kAlignment);  // one allocation per record
  Put32(header, 0x04034b50);
  Put16(header, 45);      // version needed: zip64-capable
  Put16(header, 0x0008);  // data descriptor follows the data
  Put16(header, 0);       // stored
  Put16(header, 0);       // time
  Put16(header, 0x21);    // date: 1980-01-01
  Put32(header, 0);       // crc (in the descriptor)
  Put32(header, 0);       // sizes (in the descriptor)
  Put32(header, 0);
  Put16(header, static_cast<uint16_t>(name.size()));
  // Pad with an "FB" extra field (as torch does) so the data starts 64-byte aligned.
  uint64_t data_at = record.header_offset + 30 + name.size() + zip64_extra.size() + 4;
  uint64_t pad = (kAlignment - data_at % kAlignment) % kAlignment;
  Put16(header, static_cast<uint16_t>(zip64_extra.size() + 4 + pad));
  header += name;
  header += zip64_extra;
  header += "FB";
  Put16(header, static_cast<uint16_t>(pad));
  header.append(pad, 'Z');
  SC_RETURN_IF_ERROR(out_->Write(header.data(), header.size()));
  records_.push_back(record);
  open_ = true;
  return Status::Ok();
}

Status ZipWriter::Append(const void* data, size_t bytes) {
  Record& r = records_.back();
  r.crc = libdeflate_crc32(r.crc, data, bytes);
  r.size += bytes;
  return out_->Write(data, bytes);
}

Status ZipWriter::EndRecord() {
  Record& r = records_.back();
  std::string descriptor;
  Put32(descriptor, 0x08074b50);
  Put32(descriptor, r.crc);
  if (r.zip64) {
    Put64(descriptor, r.size);
    Put64(descriptor, r.size);
  } else {
    Put32(descriptor, static_cast<uint32_t>(r.size));
    Put32(descriptor, static_cast<uint32_t>(r.size));
  }
  open_ = false;
  return out_->Write(descriptor.data(), descriptor.size());
}

Status ZipWriter::AddRecord(const std::string& name, const std::string& bytes) {
  SC_RETURN_IF_ERROR(BeginRecord(name, bytes.size()));
  SC_RETURN_IF_ERROR(Append(bytes.data(), bytes.size()));
  return EndRecord();
}

Status ZipWriter::Finish() {
  const uint64_t directory_offset = out_->position() - base_;
  std::string dir;
  size_t names = 0;
  for (const Record& r : records_) names += r.name.size();
  dir.reserve(records_.size() * (46 + 28) + names + 98);  // headers with their largest extra, the end records
  for (const Record& r : records_) {
    bool big = r.size >= kMax32 || r.header_offset >= kMax32;
    std::string extra;
    if (big) {
      Put16(extra, 0x0001);
      Put16(extra, 24);
      Put64(extra, r.size);
      Put64(extra, r.size);
      Put64(extra, r.header_offset);
    }
    Put32(dir, 0x02014b50);
    Put16(dir, 45);
    Put16(dir, 45);
    Put16(dir, 0x0008);
    Put16(dir, 0);
    Put16(dir, 0);
    Put16(dir, 0x21);
    Put32(dir, r.crc);
    Put32(dir, big ? kMax32 : static_cast<uint32_t>(r.size));
    Put32(dir, big ? kMax32 : static_cast<uint32_t>(r.size));
    Put16(dir, static_cast<uint16_t>(r.name.size()));
    Put16(dir, static_cast<uint16_t>(extra.size()));
    Put16(dir, 0);  // comment
    Put16(dir, 0);  // disk
    Put16(dir, 0);  // internal attributes
    Put32(dir, 0);  // external attributes
    Put32(dir, big ? kMax32 : static_cast<uint32_t>(r.header_offset));
    dir += r.name;
    dir += extra;
  }
  const uint64_t directory_size = dir.size();
  const uint64_t count = records_.size();
  const bool zip64 = count >= 0xFFFF || directory_offset >= kMax32 || directory_size >= kMax32;
  if (zip64) {
    const uint64_t zip64_end = directory_offset + directory_size;
    Put32(dir, 0x06064b50);
    Put64(dir, 44);
    Put16(dir, 45);
    Put16(dir, 45);
    Put32(dir, 0);
    Put32(dir, 0);
    Put64(dir, count);
    Put64(dir, count);
    Put64(dir, directory_size);
    Put64(dir, directory_offset);
    Put32(dir, 0x07064b50);  // locator
    Put32(dir, 0);
    Put64(dir, zip64_end);
    Put32(dir, 1);
  }
  Put32(dir, 0x06054b50);
  Put16(dir, 0);
  Put16(dir, 0);
  Put16(dir, zip64 ? 0xFFFF : static_cast<uint16_t>(count));
  Put16(dir, zip64 ? 0xFFFF : static_cast<uint16_t>(count));
  Put32(dir, zip64 ? kMax32 : static_cast<uint32_t>(directory_size));
  Put32(dir, zip64 ? kMax32 : static_cast<uint32_t>(directory_offset));
  Put16(dir, 0);
  return out_->Write(dir.data(), dir.size());
}

}  // namespace shardckpt
