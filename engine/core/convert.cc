#include "shardckpt/engine/core/convert.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <optional>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/core/per_rank_left.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/sha256_sidecar.h"
#include "shardckpt/engine/formats/json_keys.h"
#include "shardckpt/engine/formats/model_file_kind.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/engine/model/entry_alias.h"
#include "shardckpt/engine/model/utf8_text.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

// The layout policies, named once per conversion rather than compared by name per rank and entry.
enum class Policy { kReplicated, kFlat, kDim0 };

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "replicated") return Policy::kReplicated;
  if (name == "flat") return Policy::kFlat;
  if (name == "dim0") return Policy::kDim0;
  return InvalidArgument("unknown layout '" + name + "' (flat, dim0 or replicated)");
}

Layout LayoutOf(Policy policy, const Shape& shape, int world, int rank) {
  switch (policy) {
    case Policy::kReplicated: return Layout::Whole();
    case Policy::kFlat: return FlatShardLayout(shape, world, rank);
    case Policy::kDim0:
      return shape.empty() ? (rank == 0 ? Layout::Whole() : Layout::FlatRange(1, 1)) : ChunkLayout(shape, 0, world, rank);
  }
  return Layout::Whole();
}

// The bytes of elements [first, first + count) of the tensor being written, row-major: a pointer
// into memory the reader keeps until its next call (a file's range read into a buffer, or a
// tensor already in memory, uncopied).
using ElementReader = std::function<Result<const unsigned char*>(int64_t first, int64_t count)>;

// A piece larger than this is added in parts, each read when it is written: an import held each
// whole tensor (a 2 GB embedding table needed 2 GB of memory), now a part of one. Replicated
// pieces are one whole chunk, read whole.
constexpr uint64_t kImportPartBytes = 64u << 20;

// Writes one tensor as the pieces of `policy` for every rank. Flat and dim0 pieces are runs of
// the whole tensor, read (in parts of at most kImportPartBytes) straight from `read`.
Status WriteTensor(OfflineCheckpointWriter& out, Policy policy, int world, size_t index,
                   const std::string& name, DType dtype, const Shape& shape, const ElementReader& read) {
  SC_ASSIGN_OR_RETURN(const int64_t numel, NumElements(shape));
  const size_t element = DTypeSize(dtype);
  if (policy == Policy::kReplicated) {
    SC_ASSIGN_OR_RETURN(const unsigned char* data, read(0, numel));
    return out.AddPiece(static_cast<int>(index % world), name, dtype, shape, Layout::Whole(), data,
                        static_cast<size_t>(numel) * element);
  }
  SC_ASSIGN_OR_RETURN(const std::vector<RunPiece> pieces, RunPieces(shape, world, policy == Policy::kDim0));
  // Only pieces over the bound are cut (SplitRunPiece): a reshard of 20,000 small tensors to 64
  // ranks has 630,000 pieces and none to cut, and a list per piece was a tenth of its work.
  auto over_bound = [&](const RunPiece& p) { return static_cast<uint64_t>(p.count) * element > kImportPartBytes; };
  size_t chunks = 0;
  for (const RunPiece& p : pieces) {
    chunks += over_bound(p) ? SplitRunPiece(p, element, kImportPartBytes).size() : (p.count > 0 ? 1 : 0);
  }
  SC_ASSIGN_OR_RETURN(const size_t entry, out.Entry(name, dtype, shape, chunks));
  auto add = [&](int rank, const RunPiece& p) -> Status {
    SC_ASSIGN_OR_RETURN(const unsigned char* data, read(p.first, p.count));
    return out.AddPieceTo(entry, rank, p.layout, data, static_cast<size_t>(p.count) * element);
  };
  for (size_t r = 0; r < pieces.size(); ++r) {
    if (!over_bound(pieces[r])) {
      SC_RETURN_IF_ERROR(add(static_cast<int>(r), pieces[r]));
      continue;
    }
    for (const RunPiece& p : SplitRunPiece(pieces[r], element, kImportPartBytes)) {
      SC_RETURN_IF_ERROR(add(static_cast<int>(r), p));
    }
  }
  return Status::Ok();
}

// A tensor already in memory, whole.
ElementReader InMemory(const std::vector<unsigned char>& full, size_t element) {
  return [&full, element](int64_t first, int64_t) -> Result<const unsigned char*> {
    return full.data() + static_cast<size_t>(first) * element;
  };
}

// Reshard reads entries up to this size whole, once, and cuts every rank's piece from memory;
// larger ones piece by piece, so memory stays bounded by one piece (or this).
constexpr uint64_t kReshardWholeBelow = 64u << 20;

}  // namespace

Result<Layout> PolicyLayout(const std::string& policy, const Shape& shape, int world, int rank) {
  SC_ASSIGN_OR_RETURN(Policy parsed, ParsePolicy(policy));
  return LayoutOf(parsed, shape, world, rank);
}

namespace {

// The safetensors entries of `source` (header parsed and checked against the file's size).
Result<std::vector<SafetensorsEntry>> ReadSafetensorsIndex(const ByteSource& source, uint64_t* data_start,
                                                           std::map<std::string, std::string>* metadata) {
  const std::string& file = source.name();
  if (source.size() < 8) return DataLoss(file + ": too short for safetensors");
  uint64_t n = 0;
  SC_RETURN_IF_ERROR(source.ReadAt(0, &n, 8));
  if (n > kMaxSafetensorsHeader) {
    return DataLoss(file + ": invalid safetensors: header size " + std::to_string(n) + " is too large");
  }
  if (n > source.size() - 8) {  // a plausible header the file does not hold: cut short
    return DataLoss(file + ": invalid safetensors: the header is " + std::to_string(n) + " bytes but the file holds " +
                    std::to_string(source.size() - 8) + " after its size (truncated)");
  }
  std::string header(n, '\0');
  SC_RETURN_IF_ERROR(source.ReadAt(8, header.data(), n));
  *data_start = 8 + n;
  return ParseSafetensorsHeader(header, source.size() - 8 - n, file, metadata);
}

// One safetensors file of an import: its entries, checked against the file's size.
struct SafetensorsInput {
  ByteSource source;
  uint64_t data_start = 0;
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;  // its __metadata__
};

// Whether a safetensors file with DCP_SHARDING_INFO `info` holds pieces rather than whole tensors:
// a save_distributed file's name, or a piece placed anywhere but at offset 0 (an unreadable key
// counts as one: nothing says the tensors are whole).
bool IsDcpShardFile(const std::string& file, const std::string& info) {
  if (BaseName(file).rfind("shard-", 0) == 0) return true;
  const nlohmann::json parsed = nlohmann::json::parse(info, nullptr, false);
  if (!parsed.is_object()) return true;
  for (const auto& [name, piece] : parsed.items()) {
    if (!piece.is_object() || !piece.contains("saved_offsets") || !piece["saved_offsets"].is_array()) return true;
    for (const nlohmann::json& offset : piece["saved_offsets"]) {
      if (!offset.is_number_integer() || offset.get<int64_t>() != 0) return true;
    }
  }
  return false;
}

Result<SafetensorsInput> OpenSafetensors(const std::string& file) {
  SC_RETURN_IF_ERROR(RequireSidecarMatch(file));  // a consolidation's output, changed since
  SC_ASSIGN_OR_RETURN(ByteSource source, ByteSource::OpenFile(file));
  SafetensorsInput in{std::move(source), 0, {}, {}};
  SC_ASSIGN_OR_RETURN(in.entries, ReadSafetensorsIndex(in.source, &in.data_start, &in.metadata));
  // DCP's HuggingFaceStorageWriter(save_distributed=True) writes each rank's pieces as a
  // safetensors file of its own (shard-NNNNN-model-...), every piece under the whole tensor's
  // name with its place in this key: imported, a piece would pass for the whole tensor. The same
  // writer records the key in every file it writes, whole tensors at offset 0 included.
  if (auto info = in.metadata.find("DCP_SHARDING_INFO"); info != in.metadata.end() && IsDcpShardFile(file, info->second)) {
    return InvalidArgument(file + " is one rank's shard of a DCP save (its metadata's DCP_SHARDING_INFO places "
                                  "each tensor in a larger one): its tensors are pieces, not whole. Join the shards "
                                  "first (torch.distributed.checkpoint.consolidate_safetensors_files) and import "
                                  "what that writes");
  }
  for (const SafetensorsEntry& e : in.entries) {
    if (e.name.empty()) {
      return InvalidArgument(file + ": a tensor has an empty name (valid in safetensors, but a checkpoint entry "
                                    "needs a name): rename it before importing");
    }
  }
  return in;
}

// A Hugging Face sharded set's index (model.safetensors.index.json, pytorch_model.bin.index.json):
// its weight map as (tensor, shard file) in the index's order, each file a plain name in the
// index's folder. `what` names the kind of index in messages.
struct ShardIndex {
  std::vector<std::pair<std::string, std::string>> weights;  // (tensor, file)
  std::function<Status(const std::string&)> bad;              // DataLoss naming the index
};
Result<ShardIndex> ReadShardIndex(const std::string& index_path, const std::string& what) {
  SC_RETURN_IF_ERROR(RequireSidecarMatch(index_path));  // its shards are checked as they are opened
  SC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(index_path, uint64_t{256} << 20));
  ShardIndex out;
  out.bad = [index_path, what](const std::string& why) { return DataLoss(index_path + ": invalid " + what + " index: " + why); };
  // The weight map's order from a SAX pass, its values from a sorted object (json_keys.h).
  const JsonKeys keys = JsonObjectKeys(text, {"weight_map"});
  if (keys.too_deep) return out.bad("it nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  nlohmann::json index = nlohmann::json::parse(text, nullptr, false);
  if (!keys.found || index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return out.bad("not a JSON object with a \"weight_map\" object");
  }
  if (!keys.duplicate.empty()) return out.bad("tensor '" + keys.duplicate + "' is listed twice");
  const nlohmann::json& weight_map = index["weight_map"];
  for (const std::string& name : keys.names) {
    // The SAX pass reads the first "weight_map", the DOM keeps the last: a hostile index with two
    // is refused here, not thrown on.
    auto found_value = weight_map.find(name);
    if (found_value == weight_map.end()) return out.bad("\"weight_map\" is given twice");
    const nlohmann::json& value = *found_value;
    if (!value.is_string()) return out.bad("tensor '" + name + "' maps to a non-string");
    const std::string file = value.get<std::string>();
    if (!IsPlainFileName(file)) {  // as a manifest's and a DCP folder's names: no '/', '\\', NUL, 256+ bytes
      return out.bad("tensor '" + name + "' maps to '" + WithNulsShown(file) + "', not a file name in the index's folder");
    }
    out.weights.emplace_back(name, file);
  }
  return out;
}

// The shards of a set in the index's order, each opened once by `open`, and `order`: (shard,
// tensor within it) in the index's order; every shard's tensors must be exactly those the index
// gives it. `names` lists a shard's tensor names.
template <typename Input, typename Open, typename Names>
Result<std::vector<Input>> OpenShardSet(const ShardIndex& index, const std::string& index_path, Open open, Names names,
                                        std::vector<std::pair<size_t, size_t>>* order) {
  std::vector<Input> inputs;
  std::map<std::string, size_t> file_index;
  std::vector<std::map<std::string, size_t>> by_name;
  for (const auto& [name, file] : index.weights) {
    auto [it, fresh] = file_index.try_emplace(file, inputs.size());
    if (fresh) {
      SC_ASSIGN_OR_RETURN(Input in, open(JoinPath(DirName(index_path), file)));
      by_name.emplace_back();
      const std::vector<std::string_view> held = names(in);
      for (size_t k = 0; k < held.size(); ++k) by_name.back()[std::string(held[k])] = k;
      inputs.push_back(std::move(in));
    }
    auto found = by_name[it->second].find(name);
    if (found == by_name[it->second].end()) return index.bad("tensor '" + name + "' is not in " + file);
    order->emplace_back(it->second, found->second);
  }
  size_t held = 0;
  for (const auto& shard : by_name) held += shard.size();
  if (held != order->size()) {
    return index.bad("the shard files hold " + std::to_string(held) + " tensors but the index lists " +
                     std::to_string(order->size()));
  }
  return inputs;
}

// A Hugging Face sharded set: FOLDER/model.safetensors.index.json (or the index itself) maps each
// tensor to its shard file in the folder.
Result<std::vector<SafetensorsInput>> OpenShardedSafetensors(const std::string& index_path,
                                                             std::vector<std::pair<size_t, size_t>>* order) {
  SC_ASSIGN_OR_RETURN(const ShardIndex index, ReadShardIndex(index_path, "safetensors"));
  return OpenShardSet<SafetensorsInput>(
      index, index_path, OpenSafetensors,
      [](const SafetensorsInput& in) {
        std::vector<std::string_view> names;
        for (const SafetensorsEntry& e : in.entries) names.push_back(e.name);
        return names;
      },
      order);
}

// One torch.save file, read and checked (its tensors not yet): the zip or the legacy format.
struct TorchInput {
  std::string file;
  std::optional<ZipReader> zip;
  std::optional<ByteSource> legacy_source;
  LegacyTorchFile legacy;
  UnpickledStateDict dict;
  std::vector<int64_t> tied;  // TiedTensors(dict.tensors)
};
std::vector<int64_t> TiedTensors(const std::vector<PickleTensor>& tensors);

Result<TorchInput> OpenTorchFile(const std::string& file) {
  TorchInput in;
  in.file = file;
  SC_RETURN_IF_ERROR(RequireSidecarMatch(file));
  SC_ASSIGN_OR_RETURN(ByteSource source, ByteSource::OpenFile(file));
  if (IsLegacyTorchFile(source)) {  // torch.save before 1.6, or _use_new_zipfile_serialization=False
    SC_ASSIGN_OR_RETURN(in.legacy, ReadLegacyTorchFile(source));
    in.dict = std::move(in.legacy.dict);
    in.legacy_source = std::move(source);
  } else {
    SC_ASSIGN_OR_RETURN(in.zip, ZipReader::Open(source));
    SC_ASSIGN_OR_RETURN(in.dict, ReadTorchStateDict(*in.zip));
  }
  in.tied = TiedTensors(in.dict.tensors);
  return in;
}

// Every tensor and value of a set's shards must have a name of its own: the index checks only the
// tensors it lists, and a value (or a second tensor) of one name in two shards made a checkpoint
// that consolidation refuses, or an invalid manifest.
Status RefuseNamesInTwoShards(const std::vector<TorchInput>& shards) {
  std::unordered_map<std::string_view, size_t> shard_of;
  for (size_t k = 0; k < shards.size(); ++k) {
    auto claim = [&](std::string_view name) -> Status {
      auto [it, fresh] = shard_of.emplace(name, k);
      if (fresh || it->second == k) return Status::Ok();
      return InvalidArgument("'" + std::string(name) + "' is in both " + shards[it->second].file + " and " + shards[k].file +
                             ": a set's shards must name each tensor and value once");
    };
    for (const PickleTensor& t : shards[k].dict.tensors) SC_RETURN_IF_ERROR(claim(t.name));
    for (const PickleValue& v : shards[k].dict.values) SC_RETURN_IF_ERROR(claim(v.name));
  }
  return Status::Ok();
}

// A sharded set of torch.save files (transformers' save_pretrained(safe_serialization=False):
// pytorch_model.bin.index.json and pytorch_model-0000k-of-0000n.bin), each shard a flat state dict.
Result<std::vector<TorchInput>> OpenShardedTorch(const std::string& index_path, std::vector<std::pair<size_t, size_t>>* order) {
  SC_ASSIGN_OR_RETURN(const ShardIndex index, ReadShardIndex(index_path, "torch.save set"));
  return OpenShardSet<TorchInput>(
      index, index_path, OpenTorchFile,
      [](const TorchInput& in) {
        std::vector<std::string_view> names;
        for (const PickleTensor& t : in.dict.tensors) names.push_back(t.name);
        return names;
      },
      order);
}

// Tensors of a .pt that are one tensor under two names (the same storage, offset, sizes and
// strides): for each, the index of the first, or -1. Found by a hash of that description: a
// file of many views of one storage (a flat parameter's, or a hostile one of a million) made
// the comparison with every earlier view quadratic. 0-d and empty tensors are never tied (a
// tensor's first of its view has its sizes, so it is neither either).
std::vector<int64_t> TiedTensors(const std::vector<PickleTensor>& tensors) {
  std::vector<int64_t> tied = FirstOfSameView(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].sizes.empty() || NumElements(tensors[i].sizes).value() == 0) tied[i] = -1;
  }
  return tied;
}

Result<ConvertReport> ImportInto(const std::string& input, const std::string& root, const ConvertOptions& options) {
  SC_ASSIGN_OR_RETURN(const Policy policy, ParsePolicy(options.layout));
  ConvertReport report;
  SC_ASSIGN_OR_RETURN(const std::string file, ResolveModelFile(input));
  SC_ASSIGN_OR_RETURN(const ModelFileKind kind, ModelFileKindOf(file));
  const bool index = kind == ModelFileKind::kSafetensorsIndex;
  const bool safetensors = index || kind == ModelFileKind::kSafetensors;
  // The whole input is read and checked before the output root is touched, so a refused file
  // leaves nothing behind.
  std::vector<SafetensorsInput> shards;
  std::vector<TorchInput> torch_files;
  std::vector<std::pair<size_t, size_t>> order;  // (shard or torch file, its entry) in output order
  nlohmann::ordered_json containers = nlohmann::ordered_json::object();
  if (index) {
    SC_ASSIGN_OR_RETURN(shards, OpenShardedSafetensors(file, &order));
  } else if (safetensors) {
    SC_ASSIGN_OR_RETURN(SafetensorsInput in, OpenSafetensors(file));
    for (size_t k = 0; k < in.entries.size(); ++k) order.emplace_back(0, k);
    shards.push_back(std::move(in));
  } else if (kind == ModelFileKind::kTorchIndex) {
    SC_ASSIGN_OR_RETURN(torch_files, OpenShardedTorch(file, &order));
    SC_RETURN_IF_ERROR(RefuseNamesInTwoShards(torch_files));
  } else {
    SC_ASSIGN_OR_RETURN(TorchInput in, OpenTorchFile(file));
    for (size_t k = 0; k < in.dict.tensors.size(); ++k) order.emplace_back(0, k);
    torch_files.push_back(std::move(in));
  }
  for (const TorchInput& in : torch_files) {
    report.skipped.insert(report.skipped.end(), in.dict.skipped.begin(), in.dict.skipped.end());
    for (const auto& [path, kind] : in.dict.containers) containers[path] = kind;
  }
  // Tensors of one storage (tied weights) are stored once: the first of them in output order
  // holds the bytes (a set's index lists lm_head.weight before the embedding it shares), each
  // later one is a second name for it. By file, then the first of its group in that file: the
  // name it was stored under, or null.
  std::vector<std::vector<const std::string*>> stored_as(torch_files.size());
  for (size_t f = 0; f < torch_files.size(); ++f) stored_as[f].assign(torch_files[f].dict.tensors.size(), nullptr);
  const size_t count = order.size();
  // A stop asked for while the input was read and checked: before anything is written.
  if (options.progress) SC_RETURN_IF_ERROR(options.progress(0, count));
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OfflineCheckpointWriter> out, OfflineCheckpointWriter::Begin(root, 0, options.world_size));
  std::vector<unsigned char> full;
  // A file's tensors are read in its order, so through a window of it rather than a pread each.
  // One window per file of a set, as a set's index (sorted by name) moves between its files, a
  // fresh window at each move would read a window for every tensor; each freed after its file's
  // last tensor.
  std::vector<std::optional<ReadAheadWindow>> windows(torch_files.size());
  std::vector<size_t> last_read_of(torch_files.size(), 0);
  if (!safetensors) {
    for (size_t i = 0; i < count; ++i) last_read_of[order[i].first] = i;
  }
  for (size_t i = 0; i < count; ++i) {
    uint64_t bytes = 0;
    if (safetensors) {
      const SafetensorsInput& in = shards[order[i].first];
      const SafetensorsEntry& e = in.entries[order[i].second];
      const size_t element = DTypeSize(e.dtype);
      auto read = [&](int64_t first, int64_t count) -> Result<const unsigned char*> {
        full.resize(static_cast<size_t>(count) * element);
        SC_RETURN_IF_ERROR(in.source.ReadAt(in.data_start + e.begin + static_cast<uint64_t>(first) * element, full.data(),
                                            full.size()));
        return full.data();
      };
      SC_RETURN_IF_ERROR(WriteTensor(*out, policy, options.world_size, i, e.name, e.dtype, e.shape, read));
      bytes = e.end - e.begin;
    } else {
      const TorchInput& in = torch_files[order[i].first];
      const size_t k = order[i].second;
      const PickleTensor& t = in.dict.tensors[k];
      const std::string*& held = stored_as[order[i].first][in.tied[k] >= 0 ? static_cast<size_t>(in.tied[k]) : k];
      if (held) {  // stored once; the manifest names it twice
        SC_RETURN_IF_ERROR(out->AddAlias(t.name, *held));
        report.tensors++;
        continue;
      }
      held = &t.name;
      const size_t element = DTypeSize(t.dtype);
      // A tensor stored contiguously is read part by part; a strided view is gathered whole, once.
      const bool by_parts = StoredContiguously(t);
      std::optional<ReadAheadWindow>& window = windows[order[i].first];
      if (!window) window.emplace(in.zip ? in.zip->source() : *in.legacy_source);
      auto read_range = [&](int64_t first, int64_t count) -> Status {
        Status read = in.zip ? ReadTorchTensor(*in.zip, t, &full, first, count, &*window)
                             : ReadTorchTensor(*in.legacy_source, in.legacy, t, &full, first, count, &*window);
        return read.ok() ? read : read.WithContext(in.file);
      };
      if (!by_parts) SC_RETURN_IF_ERROR(read_range(0, -1));
      auto read = [&](int64_t first, int64_t count) -> Result<const unsigned char*> {
        if (!by_parts) return full.data() + static_cast<size_t>(first) * element;
        SC_RETURN_IF_ERROR(read_range(first, count));
        return full.data();
      };
      SC_RETURN_IF_ERROR(WriteTensor(*out, policy, options.world_size, i, t.name, t.dtype, t.sizes, read));
      bytes = static_cast<uint64_t>(NumBytes(t.sizes, element).value());
      if (i == last_read_of[order[i].first]) window.reset();
    }
    report.tensors++;
    report.bytes += bytes;
    if (options.progress) SC_RETURN_IF_ERROR(options.progress(i + 1, count));
  }
  std::unordered_map<std::string, std::string> value_order;
  std::vector<std::pair<std::string, StatePath>> paths;
  for (const TorchInput& in : torch_files) {
    for (const PickleValue& v : in.dict.values) {
      SC_RETURN_IF_ERROR(out->AddBlob(0, v.name, BlobScope::kGlobal, v.blob));
      report.values.push_back(v.name);
      if (v.tensors_before < in.dict.tensors.size()) value_order[v.name] = in.dict.tensors[v.tensors_before].name;
    }
    paths.insert(paths.end(), in.dict.paths.begin(), in.dict.paths.end());
  }
  // Absolute: a relative path names nothing from another working directory.
  std::map<std::string, std::string> user = {{"imported_from", Utf8OrReplaced(AbsoluteRoot(input))}};
  if (!containers.empty()) user[kTorchContainersKey] = containers.dump();
  // Where each nested leaf sat (dict keys, ints among them, list and tuple indices), so that the
  // .pt a consolidation writes has the nesting of the one imported (the containers alone gave
  // "optimizer.state.0.exp_avg" at the top).
  if (!paths.empty()) user[kTorchPathsKey] = EncodeStatePaths(paths);
  if (!value_order.empty()) user[kTorchValueOrderKey] = EncodeValueOrder(value_order);
  // A safetensors file's own metadata (a Hugging Face set's first shard's), less "format", which
  // consolidate writes itself: kept for safetensors output.
  if (safetensors && !shards.empty()) {
    std::map<std::string, std::string> kept = shards[0].metadata;
    kept.erase("format");
    if (!kept.empty()) user[kSafetensorsMetadataKey] = nlohmann::json(kept).dump();
  }
  if (options.progress) SC_RETURN_IF_ERROR(options.progress(count, count));  // before the commit
  SC_ASSIGN_OR_RETURN(report.path, out->Commit(MakeCreationInfo(1, "", "", user)));
  return report;
}

Result<ConvertReport> ReshardInto(const std::string& checkpoint, const std::string& root, const ConvertOptions& options) {
  SC_ASSIGN_OR_RETURN(const Policy policy, ParsePolicy(options.layout));
  SC_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(checkpoint));
  // A shardckpt step folder is refused as a place for a root by the commit; a DCP folder, which
  // has no step folders, only here.
  if (reader->is_dcp()) SC_RETURN_IF_ERROR(RefuseOutputInCheckpoint(root, reader->dir()));
  SC_RETURN_IF_ERROR(reader->CheckWantedFiles(AllBlobs(reader->manifest())));
  reader->ReadFirstWindowsAhead();  // while the new checkpoint's files are set up
  const Manifest& m = reader->manifest();
  const int world = options.world_size;
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OfflineCheckpointWriter> out, OfflineCheckpointWriter::Begin(root, m.step, world));
  out->ReserveEntries(m.entries.size());
  ConvertReport report;
  uint64_t total = 0;
  for (const EntryRecord& e : m.entries) total += static_cast<uint64_t>(NumBytes(e.shape, DTypeSize(e.dtype)).value());
  std::vector<unsigned char> piece, full;
  const std::vector<int64_t> aliases = EntryAliases(m);
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    const size_t element = DTypeSize(e.dtype);
    if (aliases[i] >= 0) {  // tied weights stay stored once
      SC_RETURN_IF_ERROR(out->AddAlias(e.name, m.entries[static_cast<size_t>(aliases[i])].name));
      report.tensors++;
      continue;
    }
    // A small entry is read once and cut in memory: one planned read instead of one per rank,
    // which dominated with thousands of small entries at many ranks.
    const uint64_t entry_bytes = static_cast<uint64_t>(NumBytes(e.shape, element).value());
    if (entry_bytes <= kReshardWholeBelow) {
      // Grown, never shrunk: a resize that grows zero-fills, and entries of alternating sizes
      // zeroed about 160 MB in a reshard of 20,000 small tensors (2% of its instructions).
      if (full.size() < entry_bytes) full.resize(static_cast<size_t>(entry_bytes));
      SC_RETURN_IF_ERROR(reader->ReadPiece(i, Layout::Whole(), full.data()));
      SC_RETURN_IF_ERROR(WriteTensor(*out, policy, world, i, e.name, e.dtype, e.shape, InMemory(full, element)));
      report.bytes += entry_bytes;
      if (options.progress) SC_RETURN_IF_ERROR(options.progress(report.bytes, total));
      report.tensors++;
      continue;
    }
    // Each new piece of a large entry is read exactly (the planner reads only its bytes): memory
    // is one piece. The pieces are those small entries get (RunPieces), read instead of cut.
    std::vector<RunPiece> pieces;
    if (policy == Policy::kReplicated) {
      pieces.push_back(RunPiece{Layout::Whole(), 0, NumElements(e.shape).value()});
    } else {
      SC_ASSIGN_OR_RETURN(pieces, RunPieces(e.shape, world, policy == Policy::kDim0));
    }
    for (size_t r = 0; r < pieces.size(); ++r) {
      const int writer = policy == Policy::kReplicated ? static_cast<int>(i % world) : static_cast<int>(r);
      const size_t piece_bytes = static_cast<size_t>(pieces[r].count) * element;
      if (piece.size() < piece_bytes) piece.resize(piece_bytes);  // as `full` above
      SC_RETURN_IF_ERROR(reader->ReadPiece(i, pieces[r].layout, piece.data()));
      SC_RETURN_IF_ERROR(out->AddPiece(writer, e.name, e.dtype, e.shape, pieces[r].layout, piece.data(), piece_bytes,
                                       pieces.size()));
      report.bytes += piece_bytes;
      if (options.progress) SC_RETURN_IF_ERROR(options.progress(report.bytes, total));
    }
    report.tensors++;
  }
  // A DCP folder's byte items whose pickle holds more than plain values are reported, not carried:
  // restoring them would mean running their pickle.
  SC_ASSIGN_OR_RETURN(const auto opaque, DcpOpaqueByteItems(reader->dir(), m));
  std::unordered_set<std::string> listed;  // the values carried, each once (per-rank ones are stored per rank)
  std::map<std::string, int> left = PerRankValuesLeft(m);  // an earlier reshard's, and this one's
  for (const BlobRecord& b : m.blobs) {
    if (auto it = opaque.find(b.name); it != opaque.end()) {
      report.skipped.push_back(OpaqueByteItemSkipped(b.name, it->second));
      continue;
    }
    if (b.scope == BlobScope::kPerRank && m.world_size != world) {
      report.skipped.push_back(b.name + "@rank" + std::to_string(b.rank) +
                               " (a per-rank value, which has no place at another world size)");
      left.emplace(b.name, m.world_size);
      continue;
    }
    SC_ASSIGN_OR_RETURN(std::string bytes, reader->ReadBlob(b));
    SC_RETURN_IF_ERROR(out->AddBlob(b.scope == BlobScope::kPerRank ? b.rank : 0, b.name, b.scope, bytes));
    if (listed.insert(b.name).second) report.values.push_back(b.name);  // a per-rank one once
  }
  // Written now, by this shardckpt, from one process: the source's time and version (empty for a
  // DCP folder) named another checkpoint's making. Its training code's commit, torch version and
  // user metadata still describe what is in it.
  CreationInfo created = MakeCreationInfo(1, m.created.torch_version, m.created.git_commit, m.created.user);
  created.user[reader->is_dcp() ? "imported_from" : "resharded_from"] = Utf8OrReplaced(AbsoluteRoot(reader->dir()));
  if (!left.empty()) created.user[kPerRankValuesLeftKey] = EncodePerRankValuesLeft(left);
  if (options.progress) SC_RETURN_IF_ERROR(options.progress(report.bytes, total));  // before the commit
  SC_ASSIGN_OR_RETURN(report.path, out->Commit(created, m.metrics));
  return report;
}

// A conversion that fails leaves no root behind that it created: the writer removes its
// temporary folder, and this the folder and lock file it made for it.
Result<ConvertReport> IntoRoot(const std::string& root,
                               Result<ConvertReport> (*convert)(const std::string&, const std::string&, const ConvertOptions&),
                               const std::string& input, const ConvertOptions& options) {
  const bool fresh = !PathExists(root);
  // Into a new root only, as the refusal below says: into a run's root, an import or a reshard of
  // another checkpoint at a later step was committed beside the run's own and became its
  // `latest`, which the run's next resume then loaded.
  // A root that cannot be listed (a permission, EIO, ESTALE) may be a run's: not taken as new.
  if (!fresh && IsDirectory(root)) {
    Result<bool> holds = ListHoldsCheckpoints(root);
    if (!holds.ok()) return holds.status().WithContext("list the output root " + root);
    if (*holds) {
      const std::string latest = ReadLatestName(root);
      return Status(Code::kAlreadyExists, root + " already holds checkpoints" +
                                              (latest.empty() ? std::string() : " (latest: " + latest + ")") +
                                              ": import and reshard write each into a new root; give an --out root "
                                              "(Python: out_root) that holds no checkpoint");
    }
  }
  Result<ConvertReport> report = convert(input, root, options);
  if (!report.ok() && report.status().code() == Code::kAlreadyExists) {
    return Status(Code::kAlreadyExists, report.status().message() +
                                            ": import writes step 0 and reshard the step it reads, each into a new "
                                            "root; give an --out root (Python: out_root) that holds no checkpoint");
  }
  if (!report.ok() && fresh && PathExists(root)) {
    Result<std::vector<std::string>> names = ListDir(root);
    if (names.ok() && (names->empty() || (names->size() == 1 && names->front() == kLockName))) {
      RemoveTree(root).IgnoreError();
    }
  }
  return report;
}

}  // namespace

Result<ConvertReport> ImportFile(const std::string& file, const std::string& root, const ConvertOptions& options) {
  // A DCP folder is read in place like a checkpoint: importing it is a reshard that adds checksums.
  return IntoRoot(root, IsDcpFolder(file) ? ReshardInto : ImportInto, file, options);
}

Result<ConvertReport> Reshard(const std::string& checkpoint, const std::string& root, const ConvertOptions& options) {
  return IntoRoot(root, ReshardInto, checkpoint, options);
}

}  // namespace shardckpt
