#include "shardckpt/engine/formats/pickle_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/formats/byte_text.h"

namespace shardckpt {
namespace {

// ---- the Python package's typed JSON (python/shardckpt/_state.py) as a pickle

constexpr const char* kTag = "__shardckpt__";

Status TypedJson(PickleWriter& p, const nlohmann::ordered_json& v, int depth) {
  if (depth > 200) return InvalidArgument("nested more than 200 deep");
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null: p.None(); return Status::Ok();
    case nlohmann::ordered_json::value_t::boolean: p.Bool(v.get<bool>()); return Status::Ok();
    case nlohmann::ordered_json::value_t::number_integer: p.Int(v.get<int64_t>()); return Status::Ok();
    case nlohmann::ordered_json::value_t::number_unsigned: p.UInt(v.get<uint64_t>()); return Status::Ok();
    case nlohmann::ordered_json::value_t::number_float: p.Float(v.get<double>()); return Status::Ok();
    case nlohmann::ordered_json::value_t::string: p.String(v.get<std::string>()); return Status::Ok();
    case nlohmann::ordered_json::value_t::array:
      p.EmptyList();
      if (!v.empty()) {
        p.Mark();
        for (const nlohmann::ordered_json& item : v) SC_RETURN_IF_ERROR(TypedJson(p, item, depth + 1));
        p.Appends();
      }
      return Status::Ok();
    case nlohmann::ordered_json::value_t::object: break;
    default: return InvalidArgument("a JSON value of an unknown kind");
  }
  auto tag = v.find(kTag);
  if (tag == v.end()) {
    p.EmptyDict();
    if (!v.empty()) {
      p.Mark();
      for (auto it = v.begin(); it != v.end(); ++it) {
        p.String(it.key());
        SC_RETURN_IF_ERROR(TypedJson(p, it.value(), depth + 1));
      }
      p.SetItems();
    }
    return Status::Ok();
  }
  if (!tag->is_string() || !v.contains("v")) return InvalidArgument("a malformed tagged value");
  const std::string kind = tag->get<std::string>();
  const nlohmann::ordered_json& value = v["v"];
  if (kind == "float" && value.is_string()) {
    p.Float(std::strtod(value.get<std::string>().c_str(), nullptr));  // inf, -inf, nan
    return Status::Ok();
  }
  // A bytearray (the Python package tags it apart) is written as bytes: pickles of plain values
  // here call no constructors.
  const bool bytes_like = kind == "bytes" || kind == "bytearray";
  if (bytes_like && value.is_string()) {
    SC_ASSIGN_OR_RETURN(std::string bytes, Base64Decode(value.get<std::string>()));
    return p.Bytes(bytes);
  }
  if (kind == "int" && value.is_string()) {  // wider than 64 bits: little-endian two's complement, in hex
    const std::string hex = value.get<std::string>();
    if (hex.empty() || hex.size() > 2 * 4096) return InvalidArgument("a malformed wide integer");
    SC_ASSIGN_OR_RETURN(std::string bytes, HexDecode(hex, "wide integer"));
    p.LongBytes(bytes);
    return Status::Ok();
  }
  if (kind == "tuple" && value.is_array()) {
    p.Mark();
    for (const nlohmann::ordered_json& item : value) SC_RETURN_IF_ERROR(TypedJson(p, item, depth + 1));
    p.Tuple();
    return Status::Ok();
  }
  if (kind == "dict" && value.is_array()) {
    p.EmptyDict();
    if (!value.empty()) {
      p.Mark();
      for (const nlohmann::ordered_json& pair : value) {
        if (!pair.is_array() || pair.size() != 2) return InvalidArgument("a malformed dict item");
        SC_RETURN_IF_ERROR(TypedJson(p, pair[0], depth + 1));
        SC_RETURN_IF_ERROR(TypedJson(p, pair[1], depth + 1));
      }
      p.SetItems();
    }
    return Status::Ok();
  }
  return InvalidArgument("an unknown tagged value '" + kind + "'");
}

}  // namespace

PickleWriter::PickleWriter(int protocol) {
  s_ += '\x80';
  s_ += static_cast<char>(protocol);
}

void PickleWriter::Int(int64_t v) {
  if (v >= 0 && v < 256) {
    s_ += 'K';
    s_ += static_cast<char>(v);
  } else if (v >= 0 && v < 65536) {
    s_ += 'M';
    s_ += static_cast<char>(v & 0xFF);
    s_ += static_cast<char>(v >> 8);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    s_ += 'J';
    int32_t x = static_cast<int32_t>(v);
    s_.append(reinterpret_cast<const char*>(&x), 4);
  } else {
    s_ += '\x8a';  // LONG1: little-endian two's complement
    s_ += '\x08';
    s_.append(reinterpret_cast<const char*>(&v), 8);
  }
}

void PickleWriter::UInt(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return Int(static_cast<int64_t>(v));
  s_ += '\x8a';  // a ninth, zero byte keeps it positive
  s_ += '\x09';
  s_.append(reinterpret_cast<const char*>(&v), 8);
  s_ += '\0';
}

void PickleWriter::LongBytes(const std::string& little_endian) {
  const uint64_t n = little_endian.size();
  if (n < 256) {
    s_ += '\x8a';
    s_ += static_cast<char>(n);
  } else {
    s_ += '\x8b';
    for (int i = 0; i < 4; ++i) s_ += static_cast<char>((n >> (8 * i)) & 0xFF);
  }
  s_ += little_endian;
}

void PickleWriter::Float(double v) {
  s_ += 'G';  // BINFLOAT: big-endian IEEE 754
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  for (int i = 7; i >= 0; --i) s_ += static_cast<char>((bits >> (8 * i)) & 0xFF);
}

void PickleWriter::String(const std::string& utf8) {
  s_ += 'X';  // BINUNICODE
  uint32_t n = static_cast<uint32_t>(utf8.size());
  s_.append(reinterpret_cast<const char*>(&n), 4);
  s_ += utf8;
}

Status PickleWriter::Bytes(const std::string& bytes) {
  // Protocol 2 has no bytes opcode: _codecs.encode(the bytes as latin1 code points, "latin1"), as
  // Python and torch.save pickle them. torch 2.x's weights_only reader takes this form and
  // refuses protocol 3's BINBYTES; 1.13's refuses both.
  const uint64_t high = static_cast<uint64_t>(std::count_if(bytes.begin(), bytes.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }));
  if (bytes.size() + high > UINT32_MAX) {
    return InvalidArgument("bytes of " + std::to_string(bytes.size()) + " bytes: past the 4 GiB a protocol 2 pickle's string holds");
  }
  std::string latin1;
  latin1.reserve(bytes.size() + high);
  for (unsigned char c : bytes) {
    if (c < 0x80) {
      latin1 += static_cast<char>(c);
    } else {
      latin1 += static_cast<char>(0xC0 | (c >> 6));
      latin1 += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  Global("_codecs", "encode");
  Mark();
  String(latin1);
  String("latin1");
  Tuple();
  Reduce();
  return Status::Ok();
}

void PickleWriter::Global(const std::string& module, const std::string& name) {
  const std::string key = module + '\n' + name;
  auto put_index = [&](char short_op, char long_op, uint32_t index) {
    if (index < 256) {
      s_ += short_op;
      s_ += static_cast<char>(index);
      return;
    }
    s_ += long_op;
    for (int b = 0; b < 4; ++b) s_ += static_cast<char>((index >> (8 * b)) & 0xFF);
  };
  auto [it, fresh] = memo_.try_emplace(key, static_cast<uint32_t>(memo_.size()));
  if (!fresh) return put_index('h', 'j', it->second);  // BINGET / LONG_BINGET
  s_ += 'c';
  s_ += key;
  s_ += '\n';
  put_index('q', 'r', it->second);  // BINPUT / LONG_BINPUT
}

void PickleWriter::IntTuple(const std::vector<int64_t>& values) {
  if (values.empty()) return EmptyTuple();
  Mark();
  for (int64_t v : values) Int(v);
  Tuple();
}

void PickleWriter::NewObject(const std::string& module, const std::string& name) {
  Global(module, name);
  EmptyTuple();
  NewObj();
}

std::string PickleWriter::Finish() {
  s_ += '.';
  return std::move(s_);
}

Status WriteTypedJson(PickleWriter& w, const nlohmann::ordered_json& value) {
  return TypedJson(w, value, 0);
}

}  // namespace shardckpt
