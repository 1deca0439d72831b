#include "shardckpt/engine/formats/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "shardckpt/engine/formats/json_keys.h"

namespace shardckpt {

Result<std::string> EncodeSafetensorsHeader(std::vector<SafetensorsEntry>& entries,
                                            const std::map<std::string, std::string>& metadata) {
  // Assembled entry by entry: an ordered_json object finds each key by a linear search, which
  // made a header of 100,000 tensors take half a minute.
  nlohmann::ordered_json meta = {{"format", "pt"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  std::string json;
  try {
    json = "{\"__metadata__\":" + meta.dump();
    uint64_t offset = 0;
    for (SafetensorsEntry& e : entries) {
      if (e.name == "__metadata__") {  // readers would take it for the file's metadata
        return InvalidArgument("tensor '__metadata__': safetensors reserves that name for the file's metadata; "
                               "write a .pt instead, or rename the tensor");
      }
      SC_ASSIGN_OR_RETURN(int64_t bytes, NumBytes(e.shape, DTypeSize(e.dtype)));
      if (!SafetensorsDTypeName(e.dtype)) {
        return InvalidArgument("tensor '" + e.name + "': dtype " + DTypeName(e.dtype) +
                               " has no safetensors type (safetensors defines no 128-bit complex); write a .pt instead");
      }
      e.begin = offset;
      e.end = offset + static_cast<uint64_t>(bytes);
      offset = e.end;
      json += "," + nlohmann::json(e.name).dump() + ":" +
              nlohmann::ordered_json{{"dtype", SafetensorsDTypeName(e.dtype)}, {"shape", e.shape},
                                     {"data_offsets", {e.begin, e.end}}}
                  .dump();
    }
    json += "}";
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("cannot encode safetensors header: ") + e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  uint64_t n = json.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + json;
}

namespace {

// Every dtype the safetensors format defines, ours or not (safetensors 0.8 writes torch's fnuz
// float8s as F8_E4M3FNUZ and F8_E5M2FNUZ).
bool IsSafetensorsDTypeName(const std::string& name) {
  static const char* const kNames[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
                                       "I32",  "U32", "F32", "F64",     "I64",     "U64",     "C64", "F4",  "F6_E2M3", "F6_E3M2",
                                       "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
  for (const char* known : kNames) {
    if (name == known) return true;
  }
  return false;
}

}  // namespace

Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& text, uint64_t data_bytes,
                                                             const std::string& origin,
                                                             std::map<std::string, std::string>* metadata) {
  auto bad = [&](const std::string& what) { return DataLoss(origin + ": invalid safetensors: " + what); };
  // Import keeps the file's order of tensors (json_keys.h: a sorted object, the order apart).
  const JsonKeys keys = JsonObjectKeys(text, {});
  if (keys.too_deep) return bad("the header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  if (!keys.found) return bad("the header is not a JSON object");
  if (!keys.duplicate.empty()) return bad("entry '" + keys.duplicate + "' is given twice");
  const std::vector<std::string>& order = keys.names;
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  entries.reserve(order.size());
  for (const std::string& name : order) {
    if (name == "__metadata__") {
      const nlohmann::json& meta = header[name];
      if (!meta.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [key, value] : meta.items()) {
        if (!value.is_string()) return bad("__metadata__ key '" + key + "' holds a non-string");
        if (metadata != nullptr) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    nlohmann::json& value = header[name];
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets") ||
        !value["dtype"].is_string() || !value["shape"].is_array() || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      return bad("entry '" + name + "' lacks dtype, shape or data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;
    const std::string dtype_name = value["dtype"].get<std::string>();
    Result<DType> dtype = ParseSafetensorsDType(dtype_name);
    if (!dtype.ok() && IsSafetensorsDTypeName(dtype_name)) {  // a valid file holding a type we lack
      return Status(Code::kUnimplemented, origin + ": tensor '" + name + "': dtype " + dtype_name +
                                              " is not supported by shardckpt (convert the tensor before importing)");
    }
    if (!dtype.ok()) return bad("entry '" + name + "': " + dtype.status().message());
    e.dtype = *dtype;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) return bad("entry '" + name + "' has a bad shape");
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) return bad("entry '" + name + "' has bad offsets");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    Result<int64_t> bytes = NumBytes(e.shape, DTypeSize(e.dtype));
    if (!bytes.ok()) return bad("entry '" + name + "': " + bytes.status().message());
    if (e.end < e.begin || e.end - e.begin != static_cast<uint64_t>(*bytes)) {
      return bad("entry '" + name + "' holds " + std::to_string(e.end - e.begin) + " bytes but its shape needs " +
                 std::to_string(*bytes));
    }
    entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t expected = 0;
  for (const SafetensorsEntry* e : sorted) {
    if (e->begin != expected) {
      return bad("entry '" + e->name + "' starts at " + std::to_string(e->begin) + ", expected " + std::to_string(expected) +
                 (e->begin < expected ? " (overlapping entries)" : " (a gap)"));
    }
    expected = e->end;
  }
  if (expected != data_bytes) {
    return bad("entries end at " + std::to_string(expected) + " but the file holds " + std::to_string(data_bytes) +
               " data bytes" + (expected < data_bytes ? " (trailing bytes)" : " (truncated)"));
  }
  return entries;
}

}  // namespace shardckpt
