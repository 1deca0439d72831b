#include "shardckpt/engine/formats/torch_file.h"

#include <cstring>
#include <map>
#include <utility>

namespace shardckpt {
namespace {

// The storage element one past the last the view addresses, overflow-checked: offset +
// sum((size - 1) * stride) + 1; 0 for a view of no elements.
Result<int64_t> ViewEnd(const PickleTensor& t, int64_t numel, const std::string& where) {
  if (numel == 0) return int64_t{0};
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(t.sizes[d] - 1, t.strides[d], &reach) || __builtin_add_overflow(last, reach, &last)) {
      return InvalidArgument(where + ": strides " + ShapeString(t.strides) + " with sizes " + ShapeString(t.sizes) +
                             " overflow 64 bits");
    }
  }
  return last + 1;
}

std::string RecordName(const PickleTensor& t) { return "data/" + t.storage_key; }

}  // namespace

Status ValidateTorchTensor(const PickleTensor& t, uint64_t record_bytes) {
  const std::string where = "tensor '" + t.name + "'";
  const uint64_t element = DTypeSize(t.dtype);
  Result<int64_t> numel = NumElements(t.sizes);
  if (!numel.ok()) return InvalidArgument(where + ": sizes: " + numel.status().message());
  if (t.strides.size() != t.sizes.size()) {
    return InvalidArgument(where + ": strides " + ShapeString(t.strides) + " and sizes " + ShapeString(t.sizes) +
                           " differ in length");
  }
  for (size_t d = 0; d < t.strides.size(); ++d) {
    if (t.strides[d] < 0) return InvalidArgument(where + ": strides " + ShapeString(t.strides) + " has a negative stride");
  }
  if (t.storage_offset < 0) return InvalidArgument(where + ": storage_offset " + std::to_string(t.storage_offset) + " is negative");
  const uint64_t storage_element = t.storage_element_size ? t.storage_element_size : element;
  const std::string storage_type = t.storage_element_size ? "untyped" : DTypeName(t.dtype);
  uint64_t storage_bytes = 0;
  if (t.storage_numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(t.storage_numel), storage_element, &storage_bytes)) {
    return InvalidArgument(where + ": storage " + RecordName(t) + " element count " + std::to_string(t.storage_numel) +
                           " is negative or overflows at " + std::to_string(storage_element) + " bytes per " + storage_type);
  }
  if (storage_bytes != record_bytes) {
    return DataLoss(where + ": storage " + RecordName(t) + " holds " + std::to_string(record_bytes) + " bytes, not " +
                    std::to_string(t.storage_numel) + " " + storage_type + " elements (" + std::to_string(storage_bytes) +
                    " bytes)");
  }
  // Elements of the tensor's dtype the storage holds (whole ones: a partial one cannot be addressed).
  const int64_t capacity = static_cast<int64_t>(storage_bytes / element);
  SC_ASSIGN_OR_RETURN(int64_t end, ViewEnd(t, *numel, where));
  if (end > capacity) {
    return InvalidArgument(where + ": the view (storage_offset " + std::to_string(t.storage_offset) + ", sizes " +
                           ShapeString(t.sizes) + ", strides " + ShapeString(t.strides) + ") reaches element " +
                           std::to_string(end - 1) + " of a storage of " + std::to_string(capacity) + " elements");
  }
  // numel <= 2^50 (NumElements) and element <= 16: the product cannot overflow.
  const uint64_t bytes = static_cast<uint64_t>(*numel) * element;
  if (bytes > storage_bytes && bytes > kMaxExpandedTensorBytes) {
    return InvalidArgument(where + ": sizes " + ShapeString(t.sizes) + " with strides " + ShapeString(t.strides) +
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
  // torch.load builds each storage once, from its first reference; a later one that disagrees
  // would be read differently here, so it is refused.
  std::map<std::string, const PickleTensor*> first;
  for (const PickleTensor& t : dict->tensors) {
    auto record = zip.records().find(zip.prefix() + RecordName(t));
    if (record == zip.records().end()) {
      return DataLoss(zip.path() + ": tensor '" + t.name + "': storage record " + RecordName(t) + " is missing");
    }
    Status valid = ValidateTorchTensor(t, record->second.size);
    if (!valid.ok()) return valid.WithContext(zip.path());
    // A typed storage is its dtype; an untyped one (torch 2.x) may be viewed as several.
    auto [it, fresh] = first.emplace(t.storage_key, &t);
    const PickleTensor& f = *it->second;
    if (!fresh && (f.storage_numel != t.storage_numel || f.storage_element_size != t.storage_element_size ||
                   (!t.storage_element_size && f.dtype != t.dtype))) {
      auto claim = [](const PickleTensor& x) {
        return std::to_string(x.storage_numel) + " " + (x.storage_element_size ? "untyped" : DTypeName(x.dtype)) + " elements";
      };
      return InvalidArgument(zip.path() + ": tensor '" + t.name + "': storage " + RecordName(t) + " is " + claim(t) +
                             " here but " + claim(f) + " for tensor '" + f.name + "'");
    }
  }
  return dict;
}

Status ReadTorchTensor(const ZipReader& zip, const PickleTensor& t, std::vector<unsigned char>* out) {
  auto record = zip.records().find(zip.prefix() + RecordName(t));
  if (record == zip.records().end()) return DataLoss(zip.path() + ": storage record " + RecordName(t) + " is missing");
  // Checked again here: this function is public, and a check costs nothing next to the read.
  SC_RETURN_IF_ERROR(ValidateTorchTensor(t, record->second.size));
  const size_t element = DTypeSize(t.dtype);
  const int64_t numel = NumElements(t.sizes).value();
  out->resize(static_cast<size_t>(numel) * element);
  if (numel == 0) return Status::Ok();
  const int64_t end = ViewEnd(t, numel, t.name).value();
  std::vector<unsigned char> span(static_cast<size_t>(end - t.storage_offset) * element);
  SC_RETURN_IF_ERROR(zip.ReadAt(record->second.data_offset + static_cast<uint64_t>(t.storage_offset) * element,
                                span.data(), span.size()));
  // Odometer over the view's indices, gathering element by element.
  const size_t n = t.sizes.size();
  std::vector<int64_t> index(n, 0);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t at = 0;
    for (size_t d = 0; d < n; ++d) at += index[d] * t.strides[d];
    std::memcpy(out->data() + static_cast<size_t>(i) * element, span.data() + static_cast<size_t>(at) * element, element);
    for (size_t d = n; d-- > 0;) {
      if (++index[d] < t.sizes[d]) break;
      index[d] = 0;
    }
  }
  return Status::Ok();
}

}  // namespace shardckpt
