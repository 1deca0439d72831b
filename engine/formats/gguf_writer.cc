#include "shardckpt/engine/formats/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "shardckpt/engine/model/utf8_text.h"

namespace shardckpt {
namespace {

// gguf_type and ggml_type numbers (ggml/include/gguf.h, ggml.h).
enum : uint32_t { kUInt32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7, kString = 8, kInt64 = 11 };
enum : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBF16 = 30 };

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutString(std::string& s, const std::string& text) {
  Put<uint64_t>(s, text.size());
  s += text;
}

void PutValue(std::string& s, const GgufValue& v) {
  switch (v.kind) {
    case GgufValue::Kind::kString:
      Put<uint32_t>(s, kString);
      PutString(s, v.text);
      return;
    case GgufValue::Kind::kInt:
      if (v.integer >= 0 && v.integer <= static_cast<int64_t>(UINT32_MAX)) {
        Put<uint32_t>(s, kUInt32);
        Put<uint32_t>(s, static_cast<uint32_t>(v.integer));
      } else if (v.integer >= INT32_MIN && v.integer < 0) {
        Put<uint32_t>(s, kInt32);
        Put<int32_t>(s, static_cast<int32_t>(v.integer));
      } else {
        Put<uint32_t>(s, kInt64);
        Put<int64_t>(s, v.integer);
      }
      return;
    case GgufValue::Kind::kFloat:
      Put<uint32_t>(s, kFloat32);
      Put<float>(s, static_cast<float>(v.real));
      return;
    case GgufValue::Kind::kBool:
      Put<uint32_t>(s, kBool);
      Put<uint8_t>(s, v.flag ? 1 : 0);
      return;
  }
}

// The general.* keys the GGUF specification types: llama.cpp refuses a file whose
// general.architecture is not a string, and reads the integer keys as uint32.
Status CheckGeneralKeyTypes(const std::vector<GgufKeyValue>& metadata) {
  static const std::set<std::string> kStrings = {
      "general.architecture", "general.name",        "general.author",     "general.version",
      "general.organization", "general.basename",    "general.finetune",   "general.description",
      "general.quantized_by", "general.size_label",  "general.license",    "general.license.name",
      "general.license.link", "general.url",         "general.doi",        "general.uuid",
      "general.repo_url",     "general.source.url",  "general.source.doi", "general.source.uuid",
      "general.source.repo_url"};
  static const std::set<std::string> kUnsigned = {"general.quantization_version", "general.file_type"};
  static const char* const kKindNames[] = {"a string", "an integer", "a float", "a bool"};
  for (const GgufKeyValue& kv : metadata) {
    const bool text = kStrings.count(kv.key) > 0, number = kUnsigned.count(kv.key) > 0;
    if (text && kv.value.kind != GgufValue::Kind::kString) {
      return InvalidArgument("GGUF metadata key '" + kv.key + "' must be a string (the GGUF specification; llama.cpp " +
                             "refuses the file otherwise), not " + kKindNames[static_cast<int>(kv.value.kind)]);
    }
    if (number && (kv.value.kind != GgufValue::Kind::kInt || kv.value.integer < 0 || kv.value.integer > UINT32_MAX)) {
      return InvalidArgument("GGUF metadata key '" + kv.key + "' must be an unsigned 32-bit integer (the GGUF specification)");
    }
  }
  return Status::Ok();
}

uint32_t GgmlType(DType dtype) {
  return dtype == DType::kFloat16 ? kGgmlF16 : dtype == DType::kBFloat16 ? kGgmlBF16 : kGgmlF32;
}

// nlohmann parses an integer literal past 64 bits as a double: this SAX pass, which sees each
// number's text, finds the first such literal (its key), so it is refused, not written as a
// float of another value.
struct WideIntegerFinder : nlohmann::json_sax<nlohmann::ordered_json> {
  std::string last_key, found;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& text) override {
    if (found.empty() && text.find_first_of(".eE") == std::string::npos) found = last_key + " = " + text;
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t& k) override {
    last_key = k;
    return true;
  }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

Result<std::vector<GgufKeyValue>> ParseGgufMetadataJson(const std::string& json, const std::string& origin) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidArgument(origin + ": GGUF metadata must be one JSON object of string, integer, float and bool values");
  }
  WideIntegerFinder wide;
  nlohmann::ordered_json::sax_parse(json, &wide);
  if (!wide.found.empty()) {
    return InvalidArgument(origin + ": GGUF metadata key '" + wide.found +
                           "' is an integer past 64 bits; only strings, integers (64-bit), floats and bools are written");
  }
  std::vector<GgufKeyValue> out;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    GgufKeyValue kv{it.key(), {}};
    const auto& v = it.value();
    if (it.key().empty()) return InvalidArgument(origin + ": a GGUF metadata key is empty");
    if (v.is_string()) {
      kv.value.kind = GgufValue::Kind::kString;
      kv.value.text = v.get<std::string>();
    } else if (v.is_boolean()) {
      kv.value.kind = GgufValue::Kind::kBool;
      kv.value.flag = v.get<bool>();
    } else if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      kv.value.kind = GgufValue::Kind::kInt;
      kv.value.integer = v.get<int64_t>();
    } else if (v.is_number_float()) {
      // Written as FLOAT32: a value past its range would read back as inf, one too small as 0.
      const double real = v.get<double>();
      if (!std::isfinite(static_cast<float>(real)) || (real != 0 && static_cast<float>(real) == 0)) {
        return InvalidArgument(origin + ": GGUF metadata key '" + it.key() + "' holds " + v.dump() + ", " +
                               (std::isfinite(static_cast<float>(real)) ? "too small for" : "past the range of") +
                               " FLOAT32, the type floats are written as");
      }
      kv.value.kind = GgufValue::Kind::kFloat;
      kv.value.real = v.get<double>();
    } else {
      return InvalidArgument(origin + ": GGUF metadata key '" + it.key() + "' holds " +
                             (v.is_null() ? std::string("null") : std::string(v.type_name()) + " " + v.dump()) +
                             "; only strings, integers (64-bit), floats and bools are written");
    }
    out.push_back(std::move(kv));
  }
  return out;
}

std::vector<GgufKeyValue> GgufMetadataWith(const std::string& architecture, const std::string& name,
                                           const std::vector<GgufKeyValue>& others) {
  std::vector<GgufKeyValue> out;
  for (const auto& pair : {std::pair<std::string, std::string>{"general.architecture", architecture},
                            std::pair<std::string, std::string>{"general.name", name}}) {
    // Not a structured binding: clang 14 (the sanitizer build) cannot capture one in a lambda.
    const std::string& key = pair.first;
    const std::string& given = pair.second;
    auto it = std::find_if(others.begin(), others.end(), [&](const GgufKeyValue& kv) { return kv.key == key; });
    if (!given.empty()) {
      GgufKeyValue kv{key, {}};
      kv.value.text = given;
      out.push_back(kv);
    } else if (it != others.end()) {
      out.push_back(*it);
    }
  }
  for (const GgufKeyValue& kv : others) {
    if (kv.key != "general.architecture" && kv.key != "general.name") out.push_back(kv);
  }
  return out;
}

Status CheckGgufTensor(const GgufTensorInfo& t) {
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat16 && t.dtype != DType::kBFloat16) {
    // --dtype casts floating tensors only: for an integer or bool tensor it is no way out.
    const bool castable = t.dtype == DType::kFloat64;
    return InvalidArgument("tensor '" + t.name + "' is " + DTypeName(t.dtype) +
                           ": GGUF output holds float32, float16 and bfloat16 tensors as they are (no quantization); " +
                           (castable ? "exclude it (--exclude; Python exclude=), or cast it (--dtype; dtype=)"
                                     : "exclude it (--exclude; Python exclude=)"));
  }
  if (!IsUtf8(t.name)) {
    return InvalidArgument("tensor '" + Utf8OrReplaced(t.name) +
                           "': its name is not valid UTF-8, which GGUF strings must be (a --strip-prefix ending inside a "
                           "character?)");
  }
  if (t.name.empty() || t.name.size() > kGgufMaxName) {
    return InvalidArgument("tensor '" + t.name + "': a GGUF tensor name has 1 to " + std::to_string(kGgufMaxName) +
                           " bytes (ggml's limit); shorten it with --strip-prefix (Python strip_prefix=) or exclude it (--exclude; exclude=)");
  }
  if (t.shape.size() > kGgufMaxDims) {
    return InvalidArgument("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) + " dims " + ShapeString(t.shape) +
                           "; ggml tensors have at most " + std::to_string(kGgufMaxDims));
  }
  return Status::Ok();
}

Result<std::string> EncodeGgufHeader(const std::vector<GgufKeyValue>& metadata, const std::vector<GgufTensorInfo>& tensors) {
  std::set<std::string> keys;
  for (const GgufKeyValue& kv : metadata) {
    if (!keys.insert(kv.key).second) return InvalidArgument("GGUF metadata key '" + kv.key + "' is given twice");
  }
  if (!keys.count("general.architecture")) {
    return InvalidArgument("GGUF output needs general.architecture (--gguf-arch or --gguf-metadata on the command "
                           "line; in Python, consolidate's gguf_architecture= or consolidate_gguf's architecture)");
  }
  if (keys.count("general.alignment")) return InvalidArgument("general.alignment is set by the writer (32)");
  for (const GgufKeyValue& kv : metadata) {  // GGUF strings are UTF-8: readers (gguf-py, llama.cpp) decode them
    if (!IsUtf8(kv.key)) return InvalidArgument("GGUF metadata key '" + Utf8OrReplaced(kv.key) + "' is not valid UTF-8");
    if (kv.value.kind == GgufValue::Kind::kString && !IsUtf8(kv.value.text)) {
      return InvalidArgument("GGUF metadata '" + kv.key + "' (--gguf-arch, --gguf-name or --gguf-metadata) is not valid UTF-8: '" +
                             Utf8OrReplaced(kv.value.text) + "'");
    }
  }
  SC_RETURN_IF_ERROR(CheckGeneralKeyTypes(metadata));
  std::string s = "GGUF";
  Put<uint32_t>(s, 3);
  Put<uint64_t>(s, tensors.size());
  Put<uint64_t>(s, metadata.size() + 1);
  for (const GgufKeyValue& kv : metadata) {
    PutString(s, kv.key);
    PutValue(s, kv.value);
  }
  PutString(s, "general.alignment");
  Put<uint32_t>(s, kUInt32);
  Put<uint32_t>(s, static_cast<uint32_t>(kGgufAlignment));
  uint64_t offset = 0;
  for (const GgufTensorInfo& t : tensors) {
    SC_RETURN_IF_ERROR(CheckGgufTensor(t));
    PutString(s, t.name);
    // ggml tensors have at least one dim: a 0-d tensor is written as [1].
    Shape dims = t.shape.empty() ? Shape{1} : t.shape;
    Put<uint32_t>(s, static_cast<uint32_t>(dims.size()));
    for (size_t d = dims.size(); d-- > 0;) Put<uint64_t>(s, static_cast<uint64_t>(dims[d]));
    Put<uint32_t>(s, GgmlType(t.dtype));
    Put<uint64_t>(s, offset);
    const uint64_t bytes = static_cast<uint64_t>(NumBytes(t.shape, DTypeSize(t.dtype)).value());
    offset += bytes + GgufPadding(bytes);
  }
  s.append(GgufPadding(s.size()), '\0');
  return s;
}

}  // namespace shardckpt
