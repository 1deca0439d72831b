#include "shardckpt/engine/formats/torch_file.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <xxhash.h>

namespace shardckpt {
namespace {

// The storage element one past the last the view addresses, overflow-checked: offset +
// sum((size - 1) * stride) + 1; 0 for a view of no elements. The error names no tensor.
Result<int64_t> ViewEnd(const PickleTensor& t, int64_t numel) {
  if (numel == 0) return int64_t{0};
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(t.sizes[d] - 1, t.strides[d], &reach) || __builtin_add_overflow(last, reach, &last)) {
      return InvalidArgument("strides " + ShapeString(t.strides) + " with sizes " + ShapeString(t.sizes) +
                             " overflow 64 bits");
    }
  }
  return last + 1;
}

std::string RecordName(const PickleTensor& t) { return "data/" + t.storage_key; }

}  // namespace

std::vector<int64_t> FirstOfSameView(const std::vector<PickleTensor>& tensors) {
  // An open-addressing table of indices, with each tensor's hash beside it: a node per tensor
  // in a std::unordered_set was most of this function's time at 100,000 tensors.
  auto hash_of = [&](const PickleTensor& t) {
    uint64_t h = XXH3_64bits(t.storage_key.data(), t.storage_key.size());
    const int64_t fixed[] = {static_cast<int64_t>(t.dtype), t.storage_offset, static_cast<int64_t>(t.sizes.size())};
    h = XXH3_64bits_withSeed(fixed, sizeof(fixed), h);
    h = XXH3_64bits_withSeed(t.sizes.data(), t.sizes.size() * sizeof(int64_t), h);
    return XXH3_64bits_withSeed(t.strides.data(), t.strides.size() * sizeof(int64_t), h);
  };
  auto same = [](const PickleTensor& x, const PickleTensor& y) {
    return x.storage_key == y.storage_key && x.dtype == y.dtype && x.storage_offset == y.storage_offset &&
           x.sizes == y.sizes && x.strides == y.strides;
  };
  size_t capacity = 16;
  while (capacity < 2 * tensors.size()) capacity *= 2;
  std::vector<int64_t> slots(capacity, -1);
  std::vector<uint64_t> hashes(tensors.size());
  std::vector<int64_t> out(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t h = hashes[i] = hash_of(tensors[i]);
    for (size_t s = h & (capacity - 1);; s = (s + 1) & (capacity - 1)) {
      const int64_t j = slots[s];
      if (j < 0) {
        slots[s] = static_cast<int64_t>(i);
        break;
      }
      if (hashes[j] == h && same(tensors[j], tensors[i])) {
        out[i] = j;
        break;
      }
    }
  }
  return out;
}

const ZipRecord* StorageRecord(const ZipReader& zip, const PickleTensor& t) {
  constexpr std::string_view kData = "data/";
  const size_t n = zip.prefix().size() + kData.size() + t.storage_key.size();
  char stack[256];
  std::string heap;
  char* key = stack;
  if (n > sizeof(stack)) {
    heap.resize(n);
    key = heap.data();
  }
  std::memcpy(key, zip.prefix().data(), zip.prefix().size());
  std::memcpy(key + zip.prefix().size(), kData.data(), kData.size());
  std::memcpy(key + zip.prefix().size() + kData.size(), t.storage_key.data(), t.storage_key.size());
  return zip.Find(std::string_view(key, n));
}

namespace {

// Every tensor against its storage's record, and all tensors naming one storage agreeing on it.
Status CheckTensorRecords(const std::string& path, const UnpickledStateDict& dict,
                          const std::function<const ZipRecord*(const PickleTensor&)>& record_of) {
  // torch.load builds each storage once, from its first reference; a later one that disagrees
  // would be read differently here, so it is refused.
  std::unordered_map<std::string_view, const PickleTensor*> first;
  first.reserve(dict.tensors.size());
  // Import materializes every view: many views repeating one small storage (each within
  // kMaxExpandedTensorBytes) would turn a file of kilobytes into hundreds of gigabytes written.
  // Views that partition or overlap their storages a little (a tensor and a row of it) stay far
  // under this bound.
  uint64_t stored = 0, viewed = 0;
  const std::vector<int64_t> same_view = FirstOfSameView(dict.tensors);  // a tensor under a second name is written once (tied)
  for (size_t i = 0; i < dict.tensors.size(); ++i) {
    const PickleTensor& t = dict.tensors[i];
    const ZipRecord* record = record_of(t);
    if (!record) return DataLoss(path + ": tensor '" + t.name + "': storage record " + RecordName(t) + " is missing");
    Status valid = ValidateTorchTensor(t, record->size);
    if (!valid.ok()) return valid.WithContext(path);
    if (same_view[i] < 0) {
      viewed += static_cast<uint64_t>(NumElements(t.sizes).value()) * DTypeSize(t.dtype);  // validated: <= 2^54
    }
    // A typed storage is its dtype; an untyped one (torch 2.x) may be viewed as several.
    auto [it, fresh] = first.emplace(t.storage_key, &t);
    if (fresh) stored += record->size;
    constexpr uint64_t kSlack = uint64_t{1} << 30;
    if (viewed > 4 * stored + kSlack) {
      return InvalidArgument(path + ": its tensors, up to '" + t.name + "', view their storages as " + std::to_string(viewed) +
                             " bytes, more than 4x the " + std::to_string(stored) +
                             " bytes stored plus 1 GiB, which import materializes: refused (views repeating their storage)");
    }
    const PickleTensor& f = *it->second;
    if (!fresh && (f.storage_numel != t.storage_numel || f.storage_element_size != t.storage_element_size ||
                   (!t.storage_element_size && f.dtype != t.dtype))) {
      auto claim = [](const PickleTensor& x) {
        return std::to_string(x.storage_numel) + " " + (x.storage_element_size ? "untyped" : DTypeName(x.dtype)) + " elements";
      };
      return InvalidArgument(path + ": tensor '" + t.name + "': storage " + RecordName(t) + " is " + claim(t) +
                             " here but " + claim(f) + " for tensor '" + f.name + "'");
    }
  }
  return Status::Ok();
}

// A validated tensor's elements from its record at `data_offset` of `record_bytes`.
}  // namespace

bool StoredContiguously(const PickleTensor& t) {
  // Not validated yet, perhaps: a tensor whose view does not compute is "not contiguous", and
  // the read that follows validates it and says why.
  const Result<int64_t> numel = NumElements(t.sizes);
  if (!numel.ok() || t.strides.size() != t.sizes.size()) return false;
  if (*numel == 0) return true;
  const Result<int64_t> end = ViewEnd(t, *numel);
  if (!end.ok() || *end - t.storage_offset != *numel) return false;
  bool contiguous = true;
  for (int64_t d = static_cast<int64_t>(t.sizes.size()) - 1, stride = 1; d >= 0 && contiguous; stride *= t.sizes[d], --d) {
    contiguous = t.sizes[d] == 1 || t.strides[d] == stride;
  }
  return contiguous;
}

namespace {

Status ReadTensorFrom(const std::function<Status(uint64_t, void*, size_t)>& read_at, const ZipRecord& record,
                      const PickleTensor& t, std::vector<unsigned char>* out, int64_t from, int64_t count) {
  // Checked again here: this function is public, and a check costs nothing next to the read.
  SC_RETURN_IF_ERROR(ValidateTorchTensor(t, record.size));
  const size_t element = DTypeSize(t.dtype);
  const int64_t numel = NumElements(t.sizes).value();
  if (count < 0) count = numel - from;
  if (from < 0 || count < 0 || from > numel || count > numel - from) {
    return InvalidArgument("tensor '" + t.name + "': elements [" + std::to_string(from) + ", +" + std::to_string(count) +
                           ") outside its " + std::to_string(numel));
  }
  out->resize(static_cast<size_t>(count) * element);
  if (count == 0) return Status::Ok();
  const int64_t end = ViewEnd(t, numel).value();
  const uint64_t first = record.data_offset + static_cast<uint64_t>(t.storage_offset) * element;
  // Row-major contiguous: the range read straight into `out`.
  if (StoredContiguously(t)) return read_at(first + static_cast<uint64_t>(from) * element, out->data(), out->size());
  const size_t n = t.sizes.size();
  if (from != 0 || count != numel) {  // a strided view: gathered whole, then the range kept
    std::vector<unsigned char> whole;
    SC_RETURN_IF_ERROR(ReadTensorFrom(read_at, record, t, &whole, 0, numel));
    std::memcpy(out->data(), whole.data() + static_cast<size_t>(from) * element, out->size());
    return Status::Ok();
  }
  std::vector<unsigned char> span(static_cast<size_t>(end - t.storage_offset) * element);
  SC_RETURN_IF_ERROR(read_at(first, span.data(), span.size()));
  // Odometer over the view's indices, gathering a run of the last dim at a time where it is
  // contiguous in the storage, else element by element.
  const int64_t run = n > 0 && t.strides[n - 1] == 1 ? t.sizes[n - 1] : 1;
  const size_t outer = run > 1 ? n - 1 : n;
  std::vector<int64_t> index(n, 0);
  for (int64_t i = 0; i < numel; i += run) {
    int64_t at = 0;
    for (size_t d = 0; d < outer; ++d) at += index[d] * t.strides[d];
    std::memcpy(out->data() + static_cast<size_t>(i) * element, span.data() + static_cast<size_t>(at) * element,
                static_cast<size_t>(run) * element);
    for (size_t d = outer; d-- > 0;) {
      if (++index[d] < t.sizes[d]) break;
      index[d] = 0;
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateTorchTensor(const PickleTensor& t, uint64_t record_bytes) {
  // Built only for an error: this runs for every tensor of a file, twice on import.
  auto where = [&] { return "tensor '" + t.name + "'"; };
  const uint64_t element = DTypeSize(t.dtype);
  Result<int64_t> numel = NumElements(t.sizes);
  if (!numel.ok()) return InvalidArgument(where() + ": sizes: " + numel.status().message());
  if (t.strides.size() != t.sizes.size()) {
    return InvalidArgument(where() + ": strides " + ShapeString(t.strides) + " and sizes " + ShapeString(t.sizes) +
                           " differ in length");
  }
  for (size_t d = 0; d < t.strides.size(); ++d) {
    if (t.strides[d] < 0) return InvalidArgument(where() + ": strides " + ShapeString(t.strides) + " has a negative stride");
  }
  if (t.storage_offset < 0) return InvalidArgument(where() + ": storage_offset " + std::to_string(t.storage_offset) + " is negative");
  const uint64_t storage_element = t.storage_element_size ? t.storage_element_size : element;
  const std::string storage_type = t.storage_element_size ? "untyped" : DTypeName(t.dtype);
  uint64_t storage_bytes = 0;
  if (t.storage_numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(t.storage_numel), storage_element, &storage_bytes)) {
    return InvalidArgument(where() + ": storage " + RecordName(t) + " element count " + std::to_string(t.storage_numel) +
                           " is negative or overflows at " + std::to_string(storage_element) + " bytes per " + storage_type);
  }
  if (storage_bytes != record_bytes) {
    return DataLoss(where() + ": storage " + RecordName(t) + " holds " + std::to_string(record_bytes) + " bytes, not " +
                    std::to_string(t.storage_numel) + " " + storage_type + " elements (" + std::to_string(storage_bytes) +
                    " bytes)");
  }
  // Elements of the tensor's dtype the storage holds (whole ones: a partial one cannot be addressed).
  const int64_t capacity = static_cast<int64_t>(storage_bytes / element);
  Result<int64_t> view_end = ViewEnd(t, *numel);
  if (!view_end.ok()) return InvalidArgument(where() + ": " + view_end.status().message());
  const int64_t end = *view_end;
  if (end > capacity) {
    return InvalidArgument(where() + ": the view (storage_offset " + std::to_string(t.storage_offset) + ", sizes " +
                           ShapeString(t.sizes) + ", strides " + ShapeString(t.strides) + ") reaches element " +
                           std::to_string(end - 1) + " of a storage of " + std::to_string(capacity) + " elements");
  }
  // numel <= 2^50 (NumElements) and element <= 16: the product cannot overflow.
  const uint64_t bytes = static_cast<uint64_t>(*numel) * element;
  if (bytes > storage_bytes && bytes > kMaxExpandedTensorBytes) {
    return InvalidArgument(where() + ": sizes " + ShapeString(t.sizes) + " with strides " + ShapeString(t.strides) +
                           " repeat a storage of " + std::to_string(storage_bytes) + " bytes into " + std::to_string(bytes) +
                           " bytes, more than import materializes (" + std::to_string(kMaxExpandedTensorBytes) + ")");
  }
  return Status::Ok();
}

Result<UnpickledStateDict> ReadTorchStateDict(const ZipReader& zip) {
  // torch 2.x records the writer's byte order; torch.load byte-swaps a file from the other
  // order, which import does not: read as it is, every value would be silently wrong.
  if (zip.records().count(zip.prefix() + "byteorder")) {
    SC_ASSIGN_OR_RETURN(std::string order, zip.ReadRecord(zip.prefix() + "byteorder", 16));
    if (order == "big") {
      return Status(Code::kUnimplemented, zip.path() + ": a big-endian torch.save file (byteorder 'big') is not "
                                                       "supported; load and save it again on a little-endian host");
    }
    if (order != "little") return DataLoss(zip.path() + ": unknown byteorder '" + order + "' (torch.load refuses it too)");
  }
  SC_ASSIGN_OR_RETURN(std::string pickle, zip.ReadRecord(zip.prefix() + "data.pkl", 256u << 20));
  Result<UnpickledStateDict> dict = UnpickleStateDict(pickle);
  if (!dict.ok()) return dict.status().WithContext(zip.path());
  SC_RETURN_IF_ERROR(CheckTensorRecords(zip.path(), dict.value(), [&](const PickleTensor& t) { return StorageRecord(zip, t); }));
  return dict;
}


Status ReadTorchTensor(const ZipReader& zip, const PickleTensor& t, std::vector<unsigned char>* out, int64_t first,
                       int64_t count, ReadAheadWindow* window) {
  const ZipRecord* record = StorageRecord(zip, t);
  if (!record) return DataLoss(zip.path() + ": storage record " + RecordName(t) + " is missing");
  return ReadTensorFrom(
      [&](uint64_t at, void* p, size_t n) { return window ? window->ReadAt(at, p, n) : zip.ReadAt(at, p, n); }, *record, t,
      out, first, count);
}

bool IsLegacyTorchFile(const ByteSource& source) {
  // The first pickle is the magic number 0x1950a86a20f9469cfc6c. Protocols 2 to 5 write it as
  // PROTO n, a FRAME header from 4 on, LONG1 of 10 bytes; protocols 0 and 1 as LONG text. Those
  // are recognised too, so that the unpickler refuses them by protocol rather than the file
  // being called a broken zip.
  static const unsigned char kLong1Magic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  static const char kTextMagic[] = "L119547037146038801333356L\n";
  unsigned char head[std::max(sizeof(kTextMagic) - 1, 2 + 9 + sizeof(kLong1Magic))] = {};
  const size_t have = static_cast<size_t>(std::min<uint64_t>(source.size(), sizeof(head)));
  if (!source.ReadAt(0, head, have).ok()) return false;
  if (have >= sizeof(kTextMagic) - 1 && std::memcmp(head, kTextMagic, sizeof(kTextMagic) - 1) == 0) return true;
  if (have < 2 || head[0] != 0x80 || head[1] < 2 || head[1] > 5) return false;
  const size_t magic_at = head[1] >= 4 && head[2] == 0x95 ? 2 + 9 : 2;  // FRAME: opcode, 8-byte length
  return have >= magic_at + sizeof(kLong1Magic) && std::memcmp(head + magic_at, kLong1Magic, sizeof(kLong1Magic)) == 0;
}

Result<LegacyTorchFile> ReadLegacyTorchFile(const ByteSource& source) {
  const std::string& path = source.name();
  // The pickles' length is known only by reading them: a window that grows until they fit,
  // bounded as data.pkl is.
  constexpr uint64_t kMaxPickles = uint64_t{256} << 20;
  LegacyHead head;
  for (uint64_t window = uint64_t{1} << 20;; window *= 4) {
    std::string bytes(std::min({window, source.size(), kMaxPickles}), '\0');
    SC_RETURN_IF_ERROR(source.ReadAt(0, bytes.data(), bytes.size()));
    bool need_more = false;
    Result<LegacyHead> r = UnpickleLegacyHead(bytes, &need_more);
    if (r.ok()) {
      head = std::move(*r);
      break;
    }
    if (!need_more || bytes.size() == source.size()) return r.status().WithContext(path);
    if (bytes.size() == kMaxPickles) return InvalidArgument(path + ": the legacy file's pickles exceed 256 MiB");
  }
  LegacyTorchFile file{std::move(head.dict), {}};
  uint64_t at = head.data_offset;
  for (const std::string& key : head.storage_keys) {
    auto element = head.element_size.find(key);
    if (element == head.element_size.end()) return DataLoss(path + ": storage '" + key + "' is listed but no tensor names it");
    int64_t count = 0;
    if (at > source.size() || source.size() - at < 8) return DataLoss(path + ": truncated before storage '" + key + "'");
    SC_RETURN_IF_ERROR(source.ReadAt(at, &count, 8));
    uint64_t bytes = 0;
    if (count < 0 || __builtin_mul_overflow(static_cast<uint64_t>(count), element->second, &bytes) ||
        bytes > source.size() - at - 8) {
      return DataLoss(path + ": storage '" + key + "' claims " + std::to_string(count) + " elements, past the end of the file");
    }
    if (!file.storages.emplace(key, ZipRecord{at + 8, bytes}).second) return DataLoss(path + ": storage '" + key + "' is listed twice");
    at += 8 + bytes;
  }
  SC_RETURN_IF_ERROR(CheckTensorRecords(path, file.dict, [&](const PickleTensor& t) -> const ZipRecord* {
    auto record = file.storages.find(t.storage_key);
    return record == file.storages.end() ? nullptr : &record->second;
  }));
  return file;
}

Status ReadTorchTensor(const ByteSource& source, const LegacyTorchFile& file, const PickleTensor& t,
                       std::vector<unsigned char>* out, int64_t first, int64_t count, ReadAheadWindow* window) {
  auto record = file.storages.find(t.storage_key);
  if (record == file.storages.end()) return DataLoss(source.name() + ": storage '" + t.storage_key + "' is missing");
  return ReadTensorFrom(
      [&](uint64_t at, void* p, size_t n) { return window ? window->ReadAt(at, p, n) : source.ReadAt(at, p, n); },
      record->second, t, out, first, count);
}

}  // namespace shardckpt
