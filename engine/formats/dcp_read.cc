#include "shardckpt/engine/formats/dcp_read.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/formats/byte_text.h"
#include "shardckpt/engine/formats/dcp_metadata.h"
#include "shardckpt/engine/formats/sha256_sidecar.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxChunkPickleBytes = uint64_t{1} << 20;

std::string OffsetsText(const std::vector<int64_t>& v) { return ShapeString(v); }

// __<rank>_<n>.distcp: the saving rank, or -1 for another name.
int RankOfFile(const std::string& name) {
  int rank = -1, n = -1;
  char tail[8] = {0};
  if (std::sscanf(name.c_str(), "__%d_%d.%7s", &rank, &n, tail) == 3 && std::string(tail) == "distcp") return rank;
  return -1;
}

// The most pieces one chunk saved in a permuted layout is read as (a transposed 4096 x 32000
// weight takes 4096): past it the chunk is refused rather than described element by element.
constexpr int64_t kMaxPiecesPerChunk = int64_t{1} << 18;

// torch 2.x's serialization_format=SAFETENSORS writes each chunk as a safetensors blob (after the
// byte items' torch.save zips) whose header metadata carries DCP_SHARDING_INFO: a valid layout
// this reader does not take, told apart from damage by that header (an 8-byte length, then the
// JSON) where the chunk's record starts.
bool IsSafetensorsVariant(const ByteSource& file, uint64_t at) {
  uint64_t header = 0;
  if (at > file.size() || file.size() - at < 10 || !file.ReadAt(at, &header, 8).ok() || header < 2 ||
      header > file.size() - at - 8) {
    return false;
  }
  std::string json(static_cast<size_t>(std::min<uint64_t>(header, 1 << 16)), '\0');
  if (!file.ReadAt(at + 8, json.data(), json.size()).ok() || json[0] != '{') return false;
  return json.find("DCP_SHARDING_INFO") != std::string::npos;
}

// The chunk's torch.save zip inside its .distcp: its one storage record, checked against the
// chunk (dtype, shape, a dense layout), as the chunks of the manifest that address it. A
// row-major record is one chunk. dcp.save keeps a view's strides (a transposed weight is saved
// transposed), so a record whose strides permute a row-major layout is cut into the largest
// boxes that are row-major in it (a transposed matrix: one per column), each its own byte range.
Status LocateChunk(const ByteSource& file, const ParsedDcpStorage& s, DType dtype, const ParsedDcpChunk& c,
                   std::vector<ChunkRecord>* out) {
  const Shape& sizes = c.sizes;
  SC_ASSIGN_OR_RETURN(ByteSource slice, file.Slice(s.offset_in_file, s.length, file.name() + " [" +
                                                   std::to_string(s.offset_in_file) + ", +" + std::to_string(s.length) + ")"));
  char magic[4] = {0};
  if (s.length >= 4) SC_RETURN_IF_ERROR(slice.ReadAt(0, magic, 4));
  if (s.length < 4 || std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    if (IsSafetensorsVariant(file, s.offset_in_file)) {
      return Status(Code::kUnimplemented, "the folder was saved with serialization_format=SAFETENSORS (its .distcp "
                                          "files are safetensors), which shardckpt does not read; save with the "
                                          "default (torch_save)");
    }
    return DataLoss("no torch.save zip starts there: the file is damaged");
  }
  SC_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(slice));
  SC_ASSIGN_OR_RETURN(std::string pickle, zip.ReadRecord(zip.prefix() + "data.pkl", kMaxChunkPickleBytes));
  SC_ASSIGN_OR_RETURN(PickleTensor t, UnpickleTensor(pickle));
  const ZipRecord* record = StorageRecord(zip, t);
  if (!record) return DataLoss("its zip has no storage record '" + t.storage_key + "'");
  SC_RETURN_IF_ERROR(ValidateTorchTensor(t, record->size));
  if (t.dtype != dtype) {
    return DataLoss(std::string("the record is ") + DTypeName(t.dtype) + ", .metadata says " + DTypeName(dtype));
  }
  if (t.sizes != sizes) return DataLoss("the record's shape is " + ShapeString(t.sizes) + ", .metadata says " + ShapeString(sizes));
  const uint64_t element = DTypeSize(dtype);
  // ValidateTorchTensor checked the view lies inside the record.
  const uint64_t base = s.offset_in_file + record->data_offset + static_cast<uint64_t>(t.storage_offset) * element;
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) {  // no elements: strides mean nothing
    out->push_back(ChunkRecord{0, base, 0, Layout::Box(c.offsets, c.sizes)});
    return Status::Ok();
  }
  // The dims that matter (size > 1), outermost in the record first; dense when each stride is
  // the product of the sizes inside it.
  std::vector<size_t> dims;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != 1) dims.push_back(d);
  }
  std::stable_sort(dims.begin(), dims.end(), [&](size_t x, size_t y) { return t.strides[x] > t.strides[y]; });
  int64_t expect = 1;
  bool dense = true;
  for (size_t k = dims.size(); k-- > 0;) {
    dense = dense && t.strides[dims[k]] == expect;
    expect *= sizes[dims[k]];
  }
  // The innermost dims that are also in row-major order form each piece; the others are walked.
  size_t inner = dims.size();
  if (inner > 0) {
    --inner;
    while (inner > 0 && dims[inner - 1] < dims[inner]) --inner;
  }
  int64_t run = 1;
  for (size_t k = inner; k < dims.size(); ++k) run *= sizes[dims[k]];
  const int64_t pieces = expect / run;
  if (!dense || pieces > kMaxPiecesPerChunk) {
    std::string strides;
    for (int64_t v : t.strides) strides += (strides.empty() ? "" : ", ") + std::to_string(v);
    return Status(Code::kUnimplemented,
                  "the chunk was saved non-contiguous (strides (" + strides + ")" +
                      (dense ? ", " + std::to_string(pieces) + " separate runs" : ", not a permutation of a dense layout") +
                      "), which shardckpt does not read; save .contiguous() tensors");
  }
  std::vector<int64_t> index(sizes.size(), 0);
  Shape piece = sizes;
  for (size_t k = 0; k < inner; ++k) piece[dims[k]] = 1;
  for (int64_t p = 0; p < pieces; ++p) {
    std::vector<int64_t> at = c.offsets;
    int64_t storage = 0;
    for (size_t k = 0; k < inner; ++k) {
      at[dims[k]] += index[dims[k]];
      storage += index[dims[k]] * t.strides[dims[k]];
    }
    out->push_back(ChunkRecord{0, base + static_cast<uint64_t>(storage) * element, static_cast<uint64_t>(run) * element,
                               Layout::Box(std::move(at), piece)});
    for (size_t k = inner; k-- > 0;) {  // the next outer index, innermost walked fastest
      if (++index[dims[k]] < sizes[dims[k]]) break;
      index[dims[k]] = 0;
    }
  }
  return Status::Ok();
}

// The byte item's data.pkl as a value blob, or why it holds more than plain values: the one
// reader of byte items, so what inspect calls plain is what consolidate and import restore.
Result<std::string> ByteItemValueBlob(ByteSource item) {
  // The item's pickle is its value (bytes of any size): bounded by the item itself, which a
  // stored record cannot outgrow, rather than by a tensor chunk's 1 MiB.
  const uint64_t limit = std::max(kMaxChunkPickleBytes, item.size());
  SC_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(std::move(item)));
  SC_ASSIGN_OR_RETURN(std::string pickle, zip.ReadRecord(zip.prefix() + "data.pkl", limit));
  return UnpickleValueBlob(pickle);
}

}  // namespace

bool IsDcpFolder(const std::string& path) {
  return PathExists(JoinPath(path, kDcpMetadataFile)) && !PathExists(JoinPath(path, kManifestName));
}

Result<Manifest> ReadDcpFolder(const std::string& dir, std::vector<DcpProblem>* problems) {
  const std::string meta_path = JoinPath(dir, kDcpMetadataFile);
  Result<ParsedDcpMetadata> parsed = [&]() -> Result<ParsedDcpMetadata> {
    // The pickle is gone before the manifest is built: tens of MB at 100,000s of chunks.
    SC_ASSIGN_OR_RETURN(std::string pickle, ReadFileLimited(meta_path, kMaxMetadataBytes));
    return ParseDcpMetadata(pickle, meta_path);
  }();
  SC_RETURN_IF_ERROR(parsed.status());
  ParsedDcpMetadata md = std::move(parsed).value();
  auto bad = [&](const std::string& what) { return DataLoss(meta_path + ": " + what); };

  Manifest m;
  m.created.user[kDcpSourceKey] = kDcpSourceValue;
  if (!md.version.empty()) m.created.user["dcp_version"] = md.version;
  // Byte items and tensors are kept apart in the manifest: where each byte item sat among the
  // tensors, so that a consolidation writes the keys in .metadata's order.
  std::unordered_map<std::string, std::string> value_order;
  const ParsedDcpItem* next_tensor = nullptr;
  for (auto item = md.items.rbegin(); item != md.items.rend(); ++item) {
    if (!item->is_bytes) next_tensor = &*item;
    else if (next_tensor != nullptr) value_order[item->name] = next_tensor->name;
  }
  if (!value_order.empty()) m.created.user[kTorchValueOrderKey] = EncodeValueOrder(value_order);
  // The nesting dcp.save flattened, for a consolidation to rebuild as dcp_to_torch_save does.
  if (!md.paths.empty()) m.created.user[kTorchPathsKey] = EncodeStatePaths(md.paths);
  // Files first: each named once, a plain name inside the folder, its size as it is now.
  std::map<std::string, uint32_t> file_index;
  std::vector<std::optional<ByteSource>> sources;
  std::vector<size_t> problem_of_file;  // a missing file's problem, which names what it holds
  int max_rank = -1;
  for (const ParsedDcpStorage& s : md.storage) {
    if (!IsPlainFileName(s.relative_path)) {
      return bad("'" + s.fqn + "' is stored in '" + s.relative_path + "', not a plain file name in the folder (refused)");
    }
    if (!s.transforms.empty()) {
      std::string list;
      for (const std::string& t : s.transforms) list += (list.empty() ? "" : ", ") + t;
      return Status(Code::kUnimplemented, meta_path + ": '" + s.fqn + "' is stored through transform extensions (" +
                                              list + ", e.g. compression), which shardckpt does not read");
    }
    if (file_index.count(s.relative_path)) continue;
    file_index[s.relative_path] = static_cast<uint32_t>(m.files.size());
    FileRecord f;
    f.name = s.relative_path;
    f.checksums = false;
    Result<ByteSource> source = ByteSource::OpenFile(JoinPath(dir, f.name));
    if (source.ok()) {
      f.size = f.table_offset = source->size();
      sources.push_back(std::move(source).value());
    } else if (problems) {
      problem_of_file.resize(m.files.size() + 1, SIZE_MAX);
      problem_of_file[m.files.size()] = problems->size();
      const bool missing = source.status().code() == Code::kNotFound;
      problems->push_back(DcpProblem{f.name, 0, (missing ? "missing: " : "unreadable: ") + source.status().message(), {},
                                     {}, !missing});
      sources.push_back(std::nullopt);
    } else {
      return source.status().WithContext(dir);
    }
    max_rank = std::max(max_rank, RankOfFile(f.name));
    m.files.push_back(std::move(f));
  }
  m.world_size = max_rank >= 0 ? max_rank + 1 : std::max<int>(1, static_cast<int>(m.files.size()));

  // storage_data by (fqn, chunk offsets); byte items by fqn alone.
  std::map<std::pair<std::string, std::vector<int64_t>>, const ParsedDcpStorage*> tensor_at;
  std::map<std::string, const ParsedDcpStorage*> bytes_at;
  for (const ParsedDcpStorage& s : md.storage) {
    bool fresh = s.offset ? tensor_at.emplace(std::make_pair(s.fqn, *s.offset), &s).second : bytes_at.emplace(s.fqn, &s).second;
    if (!fresh) return bad("'" + s.fqn + "' has two storage records for one chunk");
  }
  // Two records sharing bytes of a file: DCP never writes that; a hand-edited .metadata might.
  // Checked before any chunk is located: a chunk read as many pieces (a permuted layout) could
  // otherwise be described again and again over the same bytes (hundreds of gigabytes of
  // records from a small .metadata). Every located piece lies inside its record's bytes.
  auto past_its_file = [&](const ParsedDcpStorage& s, uint32_t file) {
    return s.offset_in_file > m.files[file].size || s.length > m.files[file].size - s.offset_in_file;
  };
  {
    std::map<std::string_view, std::vector<std::pair<uint64_t, uint64_t>>> spans;
    for (const ParsedDcpStorage& s : md.storage) {
      // A record past its file's end (or in a file that cannot be read) is refused for that below.
      const uint32_t file = file_index.at(s.relative_path);
      if (s.length == 0 || !sources[file] || past_its_file(s, file)) continue;
      spans[s.relative_path].push_back({s.offset_in_file, s.offset_in_file + s.length});
    }
    for (auto& [file, ranges] : spans) {
      std::sort(ranges.begin(), ranges.end());
      for (size_t k = 1; k < ranges.size(); ++k) {
        if (ranges[k].first < ranges[k - 1].second) {
          return bad("two records overlap in " + std::string(file) + " at offset " + std::to_string(ranges[k].first));
        }
      }
    }
  }
  // Pieces beyond one per chunk (permuted chunks), over the whole folder: a legitimate folder
  // of many transposed weights has a few million; past this, memory for the records runs out.
  constexpr uint64_t kMaxExtraPieces = uint64_t{1} << 23;
  uint64_t extra_pieces = 0;
  auto problem = [&](const ParsedDcpStorage& s, const std::string& name, const Status& st, bool byte_item) -> Status {
    const std::string what = "'" + name + "' at [" + std::to_string(s.offset_in_file) + ", +" + std::to_string(s.length) +
                             ") of " + s.relative_path + ": " + st.message();
    // Damage is a problem to list; a valid chunk this reader does not take is not.
    if (!problems || st.code() == Code::kUnimplemented) {
      return Status(st.code() == Code::kUnimplemented ? st.code() : Code::kDataLoss, JoinPath(dir, s.relative_path) + ": " + what);
    }
    problems->push_back(DcpProblem{s.relative_path, s.offset_in_file, st.message(), {}, {}, st.code() == Code::kIoError});
    (byte_item ? problems->back().blobs : problems->back().entries).push_back(name);
    return Status::Ok();
  };
  for (const ParsedDcpItem& item : md.items) {
    if (item.is_bytes) {
      auto it = bytes_at.find(item.name);
      if (it == bytes_at.end()) return bad("byte item '" + item.name + "' has no storage record");
      const ParsedDcpStorage& s = *it->second;
      const uint32_t file = file_index.at(s.relative_path);
      if (!sources[file]) {
        (*problems)[problem_of_file[file]].blobs.push_back(item.name);
        continue;
      }
      if (past_its_file(s, file)) {
        SC_RETURN_IF_ERROR(problem(s, item.name, DataLoss("runs past the end of the file (" + std::to_string(m.files[file].size) +
                                                          " bytes): truncated?"),
                                   /*byte_item=*/true));
        continue;
      }
      m.blobs.push_back(BlobRecord{item.name, BlobScope::kGlobal, 0, file, s.offset_in_file, s.length});
      continue;
    }
    if (!item.unsupported.empty()) {
      return Status(Code::kUnimplemented, meta_path + ": tensor '" + item.name + "': dtype " + item.unsupported +
                                              " is not supported by shardckpt");
    }
    EntryRecord e;
    e.name = item.name;
    e.dtype = item.dtype;
    e.shape = item.size;
    SC_RETURN_IF_ERROR(NumBytes(e.shape, DTypeSize(e.dtype)).status().WithContext(meta_path + ": tensor '" + e.name + "'"));
    for (const ParsedDcpChunk& c : item.chunks) {
      Layout layout = Layout::Box(c.offsets, c.sizes);
      Result<int64_t> count = ValidateLayout(layout, e.shape);
      if (!count.ok()) return bad("tensor '" + e.name + "' chunk at " + OffsetsText(c.offsets) + ": " + count.status().message());
      auto it = tensor_at.find({item.name, c.offsets});
      if (it == tensor_at.end()) return bad("tensor '" + e.name + "' chunk at " + OffsetsText(c.offsets) + " has no storage record");
      const ParsedDcpStorage& s = *it->second;
      const uint32_t file = file_index.at(s.relative_path);
      if (!sources[file]) {
        std::vector<std::string>& held = (*problems)[problem_of_file[file]].entries;
        if (held.empty() || held.back() != e.name) held.push_back(e.name);  // each tensor once
        continue;
      }
      std::vector<ChunkRecord> located;
      Status status = LocateChunk(*sources[file], s, e.dtype, c, &located);
      if (!status.ok()) {
        SC_RETURN_IF_ERROR(problem(s, e.name, status, /*byte_item=*/false));
        continue;
      }
      extra_pieces += located.empty() ? 0 : located.size() - 1;
      if (extra_pieces > kMaxExtraPieces) {
        return Status(Code::kUnimplemented, meta_path + ": tensor '" + e.name + "': the folder's permuted chunks are read as more than " +
                                                std::to_string(kMaxExtraPieces) + " pieces beyond one per chunk; refused");
      }
      for (ChunkRecord& chunk : located) {
        chunk.file = file;
        e.chunks.push_back(std::move(chunk));
      }
    }
    m.entries.push_back(std::move(e));
  }
  if (problems && !problems->empty()) return m;  // chunks left out: coverage would only repeat them
  Status valid = ValidateManifest(m);
  if (!valid.ok()) return valid.WithContext(dir);
  return m;
}

std::vector<DcpProblem> CheckDcpSha256Files(const std::string& dir, const Manifest& m, uint64_t* checked, uint64_t* bytes) {
  std::vector<DcpProblem> problems;
  for (const FileRecord& f : m.files) {
    Result<SidecarCheck> check = CheckSha256Sidecar(JoinPath(dir, f.name));
    if (!check.ok()) {
      problems.push_back(DcpProblem{f.name, 0, check.status().message(), {}, {},
                                    check.status().code() != Code::kNotFound && check.status().code() != Code::kDataLoss});
      if (PathExists(JoinPath(dir, f.name + ".sha256"))) (*checked)++;
      continue;
    }
    if (!check->had_sidecar) continue;
    (*checked)++;
    *bytes += check->bytes_hashed;
    if (!check->problem.empty()) problems.push_back(DcpProblem{f.name, 0, check->problem, {}, {}});
  }
  return problems;
}

Result<std::map<std::string, std::string>> DcpOpaqueByteItems(const std::string& dir, const Manifest& m) {
  std::map<std::string, std::string> out;
  if (!BuiltFromDcpFolder(m)) return out;
  for (const BlobRecord& b : m.blobs) {
    SC_ASSIGN_OR_RETURN(ByteSource file, ByteSource::OpenFile(JoinPath(dir, m.files[b.file].name)));
    SC_ASSIGN_OR_RETURN(ByteSource slice, file.Slice(b.offset, b.bytes, "byte item '" + b.name + "'"));
    Status plain = ByteItemValueBlob(std::move(slice)).status();
    if (!plain.ok()) out.emplace(b.name, plain.message());
  }
  return out;
}

std::string OpaqueByteItemSkipped(const std::string& name, const std::string& reason) {
  return name + " (a DCP byte item that is not plain values: " + reason + ")";
}

Result<std::string> DcpByteItemValue(const std::string& item, const std::string& name) {
  return ByteItemValueBlob(ByteSource::FromBytes(item, "byte item '" + name + "'"));
}

bool BuiltFromDcpFolder(const Manifest& m) {
  auto mark = m.created.user.find(kDcpSourceKey);
  return mark != m.created.user.end() && mark->second == kDcpSourceValue &&
         std::all_of(m.files.begin(), m.files.end(), [](const FileRecord& f) { return EndsWith(f.name, ".distcp"); });
}

Result<DcpByteItemBlob> DcpValueAsLoaded(std::string value_blob) {
  DcpByteItemBlob out;
  out.bytes = std::move(value_blob);
  if (out.bytes.size() < 2) return out;
  const nlohmann::json value = nlohmann::json::parse(out.bytes.begin() + 2, out.bytes.end(), nullptr, false);
  const auto tag = value.is_object() ? value.find("__shardckpt__") : value.end();
  if (tag != value.end() && *tag == "bytes" && value.contains("v") && value["v"].is_string()) {
    SC_ASSIGN_OR_RETURN(out.bytes, Base64Decode(value["v"].get<std::string>()));
    out.is_bytes = true;
  }
  return out;
}

Result<DcpByteItemBlob> DecodeDcpByteItem(const std::string& item, const std::string& name) {
  SC_ASSIGN_OR_RETURN(std::string value, DcpByteItemValue(item, name));
  return DcpValueAsLoaded(std::move(value));
}

}  // namespace shardckpt
