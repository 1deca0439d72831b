#include "shardckpt/engine/model/manifest.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include <unordered_set>

#include "shardckpt/engine/model/chunk_packing.h"
#include "shardckpt/engine/model/coverage.h"
#include "shardckpt/io/checksum.h"

namespace shardckpt {
namespace {

using nlohmann::json;

json EncodeLayout(const ChunkRecord& chunk, const Shape& shape) {
  // Compact on purpose: a million chunks must parse in well under a second.
  // [file, offset, bytes, begin, end] for flat ranges, [file, offset, bytes, offsets, sizes] for
  // boxes; a replicated chunk is written as the full box.
  json out = json::array({chunk.file, chunk.offset, chunk.bytes});
  switch (chunk.layout.kind) {
    case LayoutKind::kFlatRange:
      out.push_back(chunk.layout.begin);
      out.push_back(chunk.layout.end);
      break;
    case LayoutKind::kBox:
      out.push_back(chunk.layout.offsets);
      out.push_back(chunk.layout.sizes);
      break;
    case LayoutKind::kWhole:
      out.push_back(std::vector<int64_t>(shape.size(), 0));
      out.push_back(shape);
      break;
  }
  return out;
}

std::vector<int64_t> IntList(const json& value, const char* what) {
  if (!value.is_array()) throw std::runtime_error(std::string(what) + " is not a list");
  std::vector<int64_t> out;
  out.reserve(value.size());
  for (const json& v : value) {
    if (!v.is_number_integer()) throw std::runtime_error(std::string(what) + " holds a non-integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

uint64_t U64(const json& value, const char* what) {
  if (!value.is_number_unsigned()) {
    throw std::runtime_error(std::string(what) + " is not a non-negative integer");
  }
  return value.get<uint64_t>();
}

std::string Str(const json& value, const char* what) {
  if (!value.is_string()) throw std::runtime_error(std::string(what) + " is not a string");
  return value.get<std::string>();
}

const json& Field(const json& object, const char* key) {
  if (!object.is_object()) throw std::runtime_error(std::string("expected an object holding '") + key + "'");
  auto it = object.find(key);
  if (it == object.end()) throw std::runtime_error(std::string("missing field '") + key + "'");
  return *it;
}

ChunkRecord DecodeChunk(const json& value) {
  if (!value.is_array() || value.size() != 5) throw std::runtime_error("chunk is not a 5-element list");
  ChunkRecord chunk;
  uint64_t file = U64(value[0], "chunk file");
  if (file > UINT32_MAX) throw std::runtime_error("chunk file index too large");
  chunk.file = static_cast<uint32_t>(file);
  chunk.offset = U64(value[1], "chunk offset");
  chunk.bytes = U64(value[2], "chunk bytes");
  if (value[3].is_array()) {
    chunk.layout = Layout::Box(IntList(value[3], "box offsets"), IntList(value[4], "box sizes"));
  } else {
    if (!value[3].is_number_integer() || !value[4].is_number_integer()) {
      throw std::runtime_error("flat range bounds are not integers");
    }
    chunk.layout = Layout::FlatRange(value[3].get<int64_t>(), value[4].get<int64_t>());
  }
  return chunk;
}

std::string SumsToHex(const std::vector<uint64_t>& sums) {
  std::string out;
  out.reserve(sums.size() * 16);
  for (uint64_t s : sums) out += Hex64(s);
  return out;
}

std::vector<uint64_t> HexToSums(const std::string& hex) {
  if (hex.size() % 16 != 0) throw std::runtime_error("table_sums length is not a multiple of 16");
  std::vector<uint64_t> sums(hex.size() / 16);
  for (size_t i = 0; i < sums.size(); ++i) {
    if (!ParseHex64(hex.substr(i * 16, 16), &sums[i])) throw std::runtime_error("table_sums is not hex");
  }
  return sums;
}

// The manifest checks itself: its last field is the XXH3 of the text without that field, so a
// flipped bit anywhere in it (metadata included) is detected like one in a data block.
constexpr const char* kSealKey = ",\n \"checksum\": \"xxh3:";

}  // namespace

std::string SealManifestText(const std::string& text) {
  // `text` is nlohmann's dump(1) of an object: it ends with "\n}".
  std::string body = text.substr(0, text.size() - 2);
  return body + kSealKey + Hex64(Checksum64(text.data(), text.size())) + "\"\n}";
}

Result<std::string> CheckSeal(const std::string& text, const std::string& origin) {
  const std::string key = kSealKey;
  const size_t tail = key.size() + 16 + 3;  // key, hex, "\"\n}"
  if (text.size() < tail || text.compare(text.size() - tail, key.size(), key) != 0 ||
      text.compare(text.size() - 3, 3, "\"\n}") != 0) {
    return DataLoss(origin + ": the manifest's checksum field is missing or damaged");
  }
  uint64_t recorded = 0;
  if (!ParseHex64(text.substr(text.size() - 19, 16), &recorded)) {
    return DataLoss(origin + ": the manifest's checksum field is damaged");
  }
  std::string original = text.substr(0, text.size() - tail) + "\n}";
  if (Checksum64(original.data(), original.size()) != recorded) {
    return DataLoss(origin + ": manifest checksum mismatch: the file is corrupt or was edited");
  }
  return original;
}

uint64_t TablePages(uint64_t table_offset) {
  uint64_t blocks = table_offset / kBlockSize;
  return (blocks + kSumsPerTablePage - 1) / kSumsPerTablePage;
}

uint64_t DataFileSize(uint64_t table_offset) { return table_offset + TablePages(table_offset) * kBlockSize; }

bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

bool UsesPackedOffsets(const Manifest& m) {
  for (const EntryRecord& e : m.entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (IsPackedOffset(c.offset)) return true;
    }
  }
  for (const BlobRecord& b : m.blobs) {
    if (IsPackedOffset(b.offset)) return true;
  }
  return false;
}

Result<std::string> EncodeManifest(const Manifest& m) {
  try {
    json root;
    root["format"] = kFormatName;
    // The lowest version that describes the files: 1.0 readers can still read a checkpoint
    // without packed chunks, and refuse one with them (their validation wants every offset on a block).
    root["format_version"] = {m.format_major, UsesPackedOffsets(m) ? kFormatMinorPacked : 0};
    root["step"] = m.step;
    root["world_size"] = m.world_size;
    root["created"] = {{"time", m.created.time},
                       {"shardckpt_version", m.created.shardckpt_version},
                       {"torch_version", m.created.torch_version},
                       {"hosts", m.created.hosts},
                       {"git_commit", m.created.git_commit},
                       {"user", m.created.user}};
    if (!m.metrics.empty()) root["metrics"] = m.metrics;
    json files = json::array();
    for (const FileRecord& f : m.files) {
      files.push_back({{"name", f.name},
                       {"size", f.size},
                       {"table_offset", f.table_offset},
                       {"table_sums", SumsToHex(f.table_page_sums)}});
      if (!f.checksums) files.back()["checksums"] = false;
    }
    root["files"] = std::move(files);
    root["chunk_fields"] = "[file, offset, bytes, begin|box_offsets, end|box_sizes]";
    json entries = json::array();
    for (const EntryRecord& e : m.entries) {
      json chunks = json::array();
      for (const ChunkRecord& c : e.chunks) chunks.push_back(EncodeLayout(c, e.shape));
      entries.push_back({{"name", e.name},
                         {"dtype", DTypeName(e.dtype)},
                         {"shape", e.shape},
                         {"chunks", std::move(chunks)}});
    }
    root["entries"] = std::move(entries);
    json blobs = json::array();
    for (const BlobRecord& b : m.blobs) {
      blobs.push_back({{"name", b.name},
                       {"scope", b.scope == BlobScope::kGlobal ? "global" : "per_rank"},
                       {"rank", b.rank},
                       {"file", b.file},
                       {"offset", b.offset},
                       {"bytes", b.bytes}});
    }
    root["blobs"] = std::move(blobs);
    return SealManifestText(root.dump(1));
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("cannot encode manifest (names must be UTF-8): ") + e.what());
  }
}

namespace {
// `check`: verify the seal and run ValidateManifest (skipped only for text a rank of this job
// already decoded with check on).
Result<Manifest> Decode(const std::string& text, const std::string& origin, bool check) {
  Manifest m;
  std::string where = "header";
  try {
    json root = json::parse(text);
    if (!root.is_object() || Str(Field(root, "format"), "format") != kFormatName) {
      return DataLoss(origin + ": not a shardckpt manifest");
    }
    std::vector<int64_t> version = IntList(Field(root, "format_version"), "format_version");
    if (version.size() != 2) return DataLoss(origin + ": format_version must be [major, minor]");
    if (version[0] != kFormatMajor) {
      return Status(Code::kFailedPrecondition,
                    origin + ": format version " + std::to_string(version[0]) + "." +
                        std::to_string(version[1]) + " is not supported by this shardckpt (reads " +
                        std::to_string(kFormatMajor) + ".x); upgrade shardckpt");
    }
    m.format_major = static_cast<int>(version[0]);
    m.format_minor = static_cast<int>(version[1]);
    if (check) SC_RETURN_IF_ERROR(CheckSeal(text, origin).status());
    if (!Field(root, "step").is_number_integer()) throw std::runtime_error("step is not an integer");
    m.step = Field(root, "step").get<int64_t>();
    uint64_t world = U64(Field(root, "world_size"), "world_size");
    if (world == 0 || world > (1u << 24)) throw std::runtime_error("world_size out of range");
    m.world_size = static_cast<int>(world);
    if (root.contains("created") && root["created"].is_object()) {
      const json& c = root["created"];
      if (c.contains("time") && c["time"].is_string()) m.created.time = c["time"];
      if (c.contains("shardckpt_version") && c["shardckpt_version"].is_string()) m.created.shardckpt_version = c["shardckpt_version"];
      if (c.contains("torch_version") && c["torch_version"].is_string()) m.created.torch_version = c["torch_version"];
      if (c.contains("hosts") && c["hosts"].is_number_integer()) m.created.hosts = c["hosts"];
      if (c.contains("git_commit") && c["git_commit"].is_string()) m.created.git_commit = c["git_commit"];
      if (c.contains("user") && c["user"].is_object()) {
        for (auto& [k, v] : c["user"].items()) {
          if (v.is_string()) m.created.user[k] = v.get<std::string>();
        }
      }
    }
    if (root.contains("metrics")) {
      where = "metrics";
      const json& metrics = root["metrics"];
      if (!metrics.is_object()) throw std::runtime_error("not an object of named numbers");
      for (auto& [k, v] : metrics.items()) {
        if (!v.is_number()) throw std::runtime_error("metric '" + k + "' is " + v.type_name() + ", not a number");
        m.metrics[k] = v.get<double>();
      }
    }
    const json& files = Field(root, "files");
    if (!files.is_array()) throw std::runtime_error("files is not a list");
    for (size_t i = 0; i < files.size(); ++i) {
      where = "files[" + std::to_string(i) + "]";
      FileRecord f;
      f.name = Str(Field(files[i], "name"), "name");
      f.size = U64(Field(files[i], "size"), "size");
      f.table_offset = U64(Field(files[i], "table_offset"), "table_offset");
      f.table_page_sums = HexToSums(Str(Field(files[i], "table_sums"), "table_sums"));
      if (files[i].contains("checksums")) {
        // Only a manifest built in memory from a DCP folder (broadcast to the other ranks of a
        // load) has files without checksums; one on disk that claims so would skip verification.
        if (check || !files[i]["checksums"].is_boolean() || files[i]["checksums"].get<bool>()) {
          throw std::runtime_error("'checksums' is not allowed in a manifest on disk");
        }
        f.checksums = false;
      }
      m.files.push_back(std::move(f));
    }
    const json& entries = Field(root, "entries");
    if (!entries.is_array()) throw std::runtime_error("entries is not a list");
    m.entries.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      where = "entries[" + std::to_string(i) + "]";
      EntryRecord e;
      e.name = Str(Field(entries[i], "name"), "name");
      where = "entry '" + e.name + "'";
      SC_ASSIGN_OR_RETURN(e.dtype, ParseDType(Str(Field(entries[i], "dtype"), "dtype")));
      e.shape = IntList(Field(entries[i], "shape"), "shape");
      const json& chunks = Field(entries[i], "chunks");
      if (!chunks.is_array()) throw std::runtime_error("chunks is not a list");
      e.chunks.reserve(chunks.size());
      for (const json& c : chunks) e.chunks.push_back(DecodeChunk(c));
      m.entries.push_back(std::move(e));
    }
    const json& blobs = Field(root, "blobs");
    if (!blobs.is_array()) throw std::runtime_error("blobs is not a list");
    for (size_t i = 0; i < blobs.size(); ++i) {
      where = "blobs[" + std::to_string(i) + "]";
      BlobRecord b;
      b.name = Str(Field(blobs[i], "name"), "name");
      std::string scope = Str(Field(blobs[i], "scope"), "scope");
      if (scope != "global" && scope != "per_rank") throw std::runtime_error("unknown blob scope '" + scope + "'");
      b.scope = scope == "global" ? BlobScope::kGlobal : BlobScope::kPerRank;
      uint64_t rank = U64(Field(blobs[i], "rank"), "rank");
      uint64_t file = U64(Field(blobs[i], "file"), "file");
      if (rank > (1u << 24) || file > UINT32_MAX) throw std::runtime_error("rank or file out of range");
      b.rank = static_cast<int>(rank);
      b.file = static_cast<uint32_t>(file);
      b.offset = U64(Field(blobs[i], "offset"), "offset");
      b.bytes = U64(Field(blobs[i], "bytes"), "bytes");
      m.blobs.push_back(std::move(b));
    }
  } catch (const std::exception& e) {
    return DataLoss(origin + ": malformed manifest at " + where + ": " + e.what());
  }
  if (!check) return m;
  Status valid = ValidateManifest(m);
  if (!valid.ok()) return valid.WithContext(origin);
  return m;
}
}  // namespace

Result<Manifest> DecodeManifest(const std::string& text, const std::string& origin) {
  return Decode(text, origin, true);
}

Result<Manifest> DecodeValidatedManifest(const std::string& text, const std::string& origin) {
  return Decode(text, origin, false);
}

Status ValidateMetrics(const std::map<std::string, double>& metrics) {
  for (const auto& [name, value] : metrics) {
    if (name.empty() || name.size() > 255) return InvalidArgument("metric names must have 1 to 255 characters");
    if (!std::isfinite(value)) {
      return InvalidArgument("metric '" + name + "' is " + std::to_string(value) + ", not a finite number");
    }
  }
  return Status::Ok();
}

Status ValidateManifest(const Manifest& m) {
  auto bad = [](const std::string& what) { return DataLoss("invalid manifest: " + what); };
  Status metrics = ValidateMetrics(m.metrics);
  if (!metrics.ok()) return bad(metrics.message());
  std::unordered_set<std::string> file_names;
  for (const FileRecord& f : m.files) {
    if (!IsPlainFileName(f.name)) return bad("file name '" + f.name + "' is not a plain file name");
    if (!file_names.insert(f.name).second) return bad("file '" + f.name + "' is listed twice");
    if (!f.checksums) {
      if (f.table_offset != f.size || !f.table_page_sums.empty()) return bad("file '" + f.name + "' without checksums has a table");
      continue;
    }
    if (f.table_offset % kBlockSize != 0 || f.table_offset > static_cast<uint64_t>(kMaxBytes)) {
      return bad("file '" + f.name + "' has a misaligned or huge table_offset");
    }
    if (f.size != DataFileSize(f.table_offset)) {
      return bad("file '" + f.name + "' size " + std::to_string(f.size) +
                 " does not match its checksum table layout");
    }
    if (f.table_page_sums.size() != TablePages(f.table_offset)) {
      return bad("file '" + f.name + "' has " + std::to_string(f.table_page_sums.size()) +
                 " table checksums, expected " + std::to_string(TablePages(f.table_offset)));
    }
  }
  auto check_extent = [&](uint32_t file, uint64_t offset, uint64_t bytes,
                          const std::string& what) -> Status {
    if (file >= m.files.size()) return bad(what + " names file index " + std::to_string(file) + " out of range");
    const FileRecord& f = m.files[file];
    // Files of a DCP folder (no checksums) place records anywhere; ours keep 4096-aligned offsets
    // in format 1.0 and pack small chunks in 1.1.
    if (f.checksums && m.format_minor < kFormatMinorPacked && IsPackedOffset(offset)) {
      return bad(what + " offset " + std::to_string(offset) + " is not 4096-aligned, as format 1.0 requires");
    }
    if (offset > f.table_offset || bytes > f.table_offset - offset) {
      return bad(what + " [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                 ") runs past the data in '" + f.name + "' (" + std::to_string(f.table_offset) + " bytes)");
    }
    return Status::Ok();
  };
  std::unordered_set<std::string> entry_names;
  for (const EntryRecord& e : m.entries) {
    if (e.name.empty()) return bad("an entry has an empty name");
    if (!entry_names.insert(e.name).second) return bad("entry '" + e.name + "' is listed twice");
    Result<int64_t> bytes = NumBytes(e.shape, DTypeSize(e.dtype));
    if (!bytes.ok()) return bad("entry '" + e.name + "': " + bytes.status().message());
    std::vector<Layout> layouts;
    std::vector<std::string> owners;
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const ChunkRecord& c = e.chunks[i];
      std::string what = "entry '" + e.name + "' chunk " + std::to_string(i);
      Result<int64_t> count = ValidateLayout(c.layout, e.shape);
      if (!count.ok()) return bad(what + ": " + count.status().message());
      if (static_cast<uint64_t>(*count) * DTypeSize(e.dtype) != c.bytes) {
        return bad(what + " holds " + std::to_string(c.bytes) + " bytes but its layout needs " +
                   std::to_string(static_cast<uint64_t>(*count) * DTypeSize(e.dtype)));
      }
      SC_RETURN_IF_ERROR(check_extent(c.file, c.offset, c.bytes, what));
      layouts.push_back(c.layout);
      owners.push_back("chunk " + std::to_string(i));
    }
    Status cover = CheckExactCover(e.name, e.shape, layouts, owners);
    if (!cover.ok()) return bad(cover.message());
  }
  std::unordered_set<std::string> blob_keys;
  for (const BlobRecord& b : m.blobs) {
    std::string what = "blob '" + b.name + "'";
    if (b.name.empty()) return bad("a blob has an empty name");
    if (b.scope == BlobScope::kPerRank && b.rank >= m.world_size) {
      return bad(what + " belongs to rank " + std::to_string(b.rank) + " of a world of " +
                 std::to_string(m.world_size));
    }
    std::string key = b.name + (b.scope == BlobScope::kPerRank ? "@" + std::to_string(b.rank) : "");
    if (!blob_keys.insert(key).second) return bad(what + " is listed twice");
    SC_RETURN_IF_ERROR(check_extent(b.file, b.offset, b.bytes, what));
  }
  return Status::Ok();
}

Status CheckDataFiles(const Manifest& m,
                      const std::function<Result<uint64_t>(const std::string&)>& size_of) {
  for (const FileRecord& f : m.files) {
    Result<uint64_t> size = size_of(f.name);
    if (!size.ok()) {
      if (size.status().code() == Code::kNotFound) {
        return NotFound("data file '" + f.name + "' is missing: " + size.status().message());
      }
      return size.status();
    }
    if (*size != f.size) {
      return DataLoss("data file '" + f.name + "' is " + std::to_string(*size) +
                      " bytes, the manifest records " + std::to_string(f.size) +
                      (*size < f.size ? " (truncated)" : " (extra bytes)"));
    }
  }
  return Status::Ok();
}

}  // namespace shardckpt
