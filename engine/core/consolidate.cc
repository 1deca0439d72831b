#include "shardckpt/engine/core/consolidate.h"

#include <fnmatch.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <map>
#include <cstdint>
#include <unordered_map>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/model/float_convert.h"
#include "shardckpt/engine/formats/output_file.h"
#include "shardckpt/engine/formats/sha256_sidecar.h"
#include "shardckpt/engine/formats/byte_text.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/model/entry_alias.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/formats/zip_writer.h"
#include "shardckpt/engine/model/utf8_text.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

bool Matches(const std::vector<std::string>& globs, const std::string& name) {
  for (const std::string& g : globs) {
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

struct Selected {
  size_t entry;
  std::string name;  // in the output
  DType dtype;       // in the output
  Shape shape;
  uint64_t bytes;    // in the output
  int64_t alias = -1;  // the selected entry this one is a second name of (tied weights), or -1
};

struct Window {
  size_t selected;  // index into the selected list
  int64_t begin, end;  // elements
  uint64_t bytes = 0;  // as stored (the checkpoint's dtype)
  uint64_t at = 0;     // offset in its batch's buffer
};

// Consecutive windows read together, at most kBatchBytes of them (or one larger window):
// thousands of small entries cost one read-ahead task per batch, not a thread per entry.
constexpr uint64_t kBatchBytes = 4u << 20;
struct Batch {
  size_t first = 0, count = 0;
  uint64_t bytes = 0;
};

// Streams the bytes of `which` selected entries (converted to their output dtype), window by
// window, reading batch i+1 of windows on a helper thread while batch i is hashed and written.
Status StreamEntries(CheckpointReader& reader, const std::vector<Selected>& selected, const std::vector<size_t>& which,
                     uint64_t window_bytes, const std::function<Status(size_t)>& begin_entry,
                     const std::function<Status(const void*, size_t)>& sink, const std::function<Status(size_t)>& end_entry) {
  std::vector<Window> windows;
  std::vector<Batch> batches;
  uint64_t widest_batch = 0;
  auto add = [&](size_t k, int64_t a, int64_t b, uint64_t element) {
    Window w{k, a, b, static_cast<uint64_t>(b - a) * element, 0};
    if (batches.empty() || batches.back().bytes + w.bytes > std::min(window_bytes, kBatchBytes)) {
      batches.push_back(Batch{windows.size(), 0, 0});
    }
    Batch& batch = batches.back();
    w.at = batch.bytes;
    batch.count++;
    batch.bytes += w.bytes;
    widest_batch = std::max(widest_batch, batch.bytes);
    windows.push_back(w);
  };
  for (size_t k : which) {
    const EntryRecord& e = reader.manifest().entries[selected[k].entry];
    const uint64_t widest = std::max(DTypeSize(e.dtype), DTypeSize(selected[k].dtype));
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(window_bytes / widest));
    const int64_t numel = NumElements(e.shape).value();
    if (numel == 0) add(k, 0, 0, DTypeSize(e.dtype));
    for (int64_t a = 0; a < numel; a += step) add(k, a, std::min(numel, a + step), DTypeSize(e.dtype));
  }
  // Two buffers of the widest batch, allocated once (not zeroed: every byte is read before it is
  // used): no allocation, nor fresh pages, per window.
  std::unique_ptr<unsigned char[]> buffers[2] = {std::unique_ptr<unsigned char[]>(new unsigned char[widest_batch + 1]),
                                                 std::unique_ptr<unsigned char[]>(new unsigned char[widest_batch + 1])};
  std::vector<unsigned char> converted;
  auto read = [&](size_t b) -> Status {
    const Batch& batch = batches[b];
    for (size_t i = batch.first; i < batch.first + batch.count; ++i) {
      const Window& w = windows[i];
      if (w.end == w.begin) continue;
      const EntryRecord& e = reader.manifest().entries[selected[w.selected].entry];
      Status status = reader.ReadPiece(selected[w.selected].entry, Layout::FlatRange(w.begin, w.end),
                                       buffers[b % 2].get() + w.at);
      if (!status.ok()) return status.WithContext("entry '" + e.name + "'");
    }
    return Status::Ok();
  };
  std::future<Status> next;
  if (!batches.empty()) next = std::async(std::launch::async, read, 0);
  for (size_t b = 0; b < batches.size(); ++b) {
    SC_RETURN_IF_ERROR(next.get());
    if (b + 1 < batches.size()) next = std::async(std::launch::async, read, b + 1);
    const Batch& batch = batches[b];
    Status status;
    for (size_t i = batch.first; i < batch.first + batch.count && status.ok(); ++i) {
      const Window& w = windows[i];
      const Selected& out = selected[w.selected];
      const DType from = reader.manifest().entries[out.entry].dtype;
      if (w.begin == 0) status = begin_entry(w.selected);
      const unsigned char* data = buffers[b % 2].get() + w.at;
      if (status.ok() && from == out.dtype) {
        status = sink(data, w.bytes);
      } else if (status.ok()) {
        size_t count = w.bytes / DTypeSize(from);
        converted.resize(count * DTypeSize(out.dtype));
        ConvertFloats(from, out.dtype, data, converted.data(), count);
        status = sink(converted.data(), converted.size());
      }
      bool last_of_entry = i + 1 == windows.size() || windows[i + 1].selected != w.selected;
      if (status.ok() && last_of_entry) status = end_entry(w.selected);
    }
    if (!status.ok()) {
      if (next.valid()) next.wait();  // the helper must not outlive the buffers
      return status;
    }
  }
  return Status::Ok();
}

// An --include or --exclude glob that matches no entry and no value is a typo, or names
// something inside a value saved whole (shardckpt.save stores a dict of plain values, a
// GradScaler's state, as one value 'scaler', where import keeps each leaf, 'scaler.scale'): said,
// not silently leaving the output without it (or with it).
void WarnOfGlobsMatchingNothing(const Manifest& m, const ConsolidateOptions& options) {
  for (const auto* globs : {&options.include, &options.exclude}) {
    for (const std::string& glob : *globs) {
      auto hit = [&](const std::string& name) { return fnmatch(glob.c_str(), name.c_str(), 0) == 0; };
      if (std::any_of(m.entries.begin(), m.entries.end(), [&](const EntryRecord& e) { return hit(e.name); }) ||
          std::any_of(m.blobs.begin(), m.blobs.end(), [&](const BlobRecord& b) { return hit(b.name); })) {
        continue;
      }
      std::string holder;  // a value whose name the glob continues with a dot
      for (const BlobRecord& b : m.blobs) {
        if (glob.size() > b.name.size() && glob.compare(0, b.name.size() + 1, b.name + ".") == 0) holder = b.name;
      }
      SC_LOG(kWarn) << (globs == &options.include ? "--include '" : "--exclude '") << glob
                    << "' matches no entry or value"
                    << (holder.empty() ? std::string()
                                       : "; '" + holder + "' is one value, saved whole: select it as '" + holder + "'");
    }
  }
}

// The name in the output: `name` after --strip-prefix, "" when it is not selected.
std::string OutputName(const ConsolidateOptions& options, const std::string& name) {
  if (!options.include.empty() && !Matches(options.include, name)) return "";
  if (Matches(options.exclude, name)) return "";
  if (!options.strip_prefix.empty() && name.compare(0, options.strip_prefix.size(), options.strip_prefix) == 0) {
    return name.substr(options.strip_prefix.size());
  }
  return name;
}

// The .pt's state dict: tensors (tied ones as one storage under two names), the checkpoint's
// global blobs that hold plain values (import's, the Python package's), and the lists and tuples
// import recorded, restored.
Result<std::string> TorchStateDictPickle(CheckpointReader& reader, const ConsolidateOptions& options,
                                         const std::vector<Selected>& selected, ConsolidateReport* report) {
  const Manifest& m = reader.manifest();
  std::map<std::string, std::string> containers;
  auto recorded = m.created.user.find(kTorchContainersKey);
  if (recorded != m.created.user.end()) {
    nlohmann::json json = nlohmann::json::parse(recorded->second, nullptr, false);
    if (json.is_object()) {
      for (const auto& [path, kind] : json.items()) {
        std::string out = options.strip_prefix.empty() || path.compare(0, options.strip_prefix.size(), options.strip_prefix)
                              ? path
                              : path.substr(options.strip_prefix.size());
        if (kind.is_string() && !out.empty()) containers[out] = kind.get<std::string>();
      }
    }
  }
  // The nesting a DCP folder's planner_data recorded (dcp_to_torch_save's), by output name: a
  // stripped prefix drops the leading steps it spans, and a prefix ending inside a step leaves
  // that name at the top.
  std::unordered_map<std::string, StatePath> paths;
  if (auto recorded_paths = m.created.user.find(kTorchPathsKey); recorded_paths != m.created.user.end()) {
    for (auto& [name, path] : DecodeStatePaths(recorded_paths->second)) {
      const std::string out = OutputName(options, name);
      if (out.empty()) continue;
      size_t drop = 0;
      for (std::string walked; out != name && drop < path.size();) {
        walked += path[drop++].key + ".";
        if (walked.size() >= options.strip_prefix.size()) {
          if (walked != options.strip_prefix) drop = path.size();
          break;
        }
      }
      if (drop < path.size()) paths.emplace(out, StatePath(path.begin() + static_cast<std::ptrdiff_t>(drop), path.end()));
    }
  }
  // The plain values, each placed before the entry import recorded as following it.
  std::unordered_map<std::string, size_t> entry_index;
  std::unordered_map<std::string, std::string> follower;
  if (auto order = m.created.user.find(kTorchValueOrderKey); order != m.created.user.end()) {
    follower = DecodeValueOrder(order->second);
    if (!follower.empty()) {
      for (size_t i = 0; i < m.entries.size(); ++i) entry_index.emplace(m.entries[i].name, i);
    }
  }
  struct ValueLeaf {
    size_t before_entry;
    std::string name;
    PickleNode node;
  };
  std::vector<ValueLeaf> values;
  SC_ASSIGN_OR_RETURN(const auto opaque, DcpOpaqueByteItems(reader.dir(), m));
  for (const BlobRecord& b : m.blobs) {
    const std::string name = OutputName(options, b.name);
    if (name.empty()) continue;
    if (b.scope != BlobScope::kGlobal) {
      report->skipped.push_back(b.name + "@rank" + std::to_string(b.rank) + " (a per-rank value)");
      continue;
    }
    if (auto it = opaque.find(b.name); it != opaque.end()) {
      report->skipped.push_back(OpaqueByteItemSkipped(b.name, it->second));
      continue;
    }
    SC_ASSIGN_OR_RETURN(std::string bytes, reader.ReadBlob(b));
    if (bytes.size() >= 2 && bytes[0] == '\0' && (bytes[1] == 'B' || bytes[1] == 'b')) {
      // The Python package's bytes (or bytearray) value: a bytes value in the .pt.
      bytes = std::string(kPickleValueTag, 2) + nlohmann::ordered_json{{"__shardckpt__", "bytes"}, {"v", Base64Encode(bytes.substr(2))}}.dump();
    }
    if (bytes.compare(0, 2, std::string(kPickleValueTag, 2)) != 0) {
      report->skipped.push_back(b.name + " (bytes or a tensor blob, not a plain value)");
      continue;
    }
    size_t before = m.entries.size();
    auto next = follower.find(b.name);
    if (next != follower.end()) {
      auto at = entry_index.find(next->second);
      if (at != entry_index.end()) before = at->second;
    }
    PickleNode leaf;
    leaf.kind = PickleNode::kValue;
    leaf.json = bytes.substr(2);
    values.push_back(ValueLeaf{before, name, std::move(leaf)});
  }
  std::stable_sort(values.begin(), values.end(), [](const ValueLeaf& a, const ValueLeaf& b) { return a.before_entry < b.before_entry; });
  StateTreeBuilder tree(containers, std::move(paths));
  tree.Reserve(selected.size() + values.size());
  size_t next_value = 0;
  auto add_values_before = [&](size_t entry) -> Status {
    for (; next_value < values.size() && values[next_value].before_entry <= entry; ++next_value) {
      SC_RETURN_IF_ERROR(tree.Add(values[next_value].name, std::move(values[next_value].node)));
      report->values.push_back(values[next_value].name);
    }
    return Status::Ok();
  };
  std::vector<PickleTensor> tensors;
  tensors.reserve(selected.size());
  for (size_t k = 0; k < selected.size(); ++k) {
    const Selected& s = selected[k];
    SC_RETURN_IF_ERROR(add_values_before(s.entry));
    std::vector<int64_t> strides(s.shape.size(), 1);
    for (size_t d = s.shape.size(); d-- > 1;) strides[d - 1] = strides[d] * s.shape[d];
    const size_t key = s.alias >= 0 ? static_cast<size_t>(s.alias) : k;
    tensors.push_back(PickleTensor{s.name, s.dtype, s.shape, strides, 0, std::to_string(key), NumElements(s.shape).value()});
    PickleNode leaf;
    leaf.kind = PickleNode::kTensor;
    leaf.tensor = k;
    SC_RETURN_IF_ERROR(tree.Add(s.name, std::move(leaf)));
  }
  SC_RETURN_IF_ERROR(add_values_before(SIZE_MAX));
  return PickleTree(tensors, tree.Finish());
}

// The shard files an existing index of the same stem lists, where they are named as this writes
// them (STEM-NNNNN-of-NNNNN.safetensors): nothing else of the folder is ever touched.
std::vector<std::string> PreviousShards(const std::string& index_path, const std::string& stem) {
  std::vector<std::string> out;
  Result<std::string> text = ReadFileLimited(index_path, 64u << 20);
  if (!text.ok()) return out;
  nlohmann::json index = nlohmann::json::parse(*text, nullptr, false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) return out;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) continue;
    const std::string f = file.get<std::string>();
    unsigned a = 0, b = 0;
    if (f.compare(0, stem.size(), stem) != 0 || std::sscanf(f.c_str() + stem.size(), "-%5u-of-%5u", &a, &b) != 2 ||
        a < 1 || a > b) {
      continue;
    }
    char expected[64];
    std::snprintf(expected, sizeof(expected), "-%05u-of-%05u.safetensors", a, b);
    if (f == stem + expected && std::find(out.begin(), out.end(), f) == out.end()) {
      out.push_back(f);
    }
  }
  return out;
}

std::string Stem(const std::string& path) {
  std::string base = BaseName(path);
  return EndsWith(base, ".safetensors") ? base.substr(0, base.size() - 12) : base;
}

// The checkpoint's values, listed as not written by a format that holds tensors only; each
// rank's copy of a per-rank value named apart, as the .pt path names them.
void ListValuesNotWritten(const Manifest& m, const ConsolidateOptions& options, const std::string& why,
                          ConsolidateReport* report) {
  for (const BlobRecord& b : m.blobs) {
    if (OutputName(options, b.name).empty()) continue;
    const std::string name = b.scope == BlobScope::kGlobal ? b.name : b.name + "@rank" + std::to_string(b.rank);
    report->skipped.push_back(name + " (" + why + ")");
  }
}

}  // namespace

Result<ExportFormat> FormatFromPath(const std::string& path) {
  // .bin: transformers' pytorch_model.bin is torch.save's format, and import reads it so.
  if (EndsWith(path, ".pt") || EndsWith(path, ".pth") || EndsWith(path, ".bin")) return ExportFormat::kTorch;
  if (EndsWith(path, ".safetensors")) return ExportFormat::kSafetensors;
  if (EndsWith(path, ".gguf")) return ExportFormat::kGguf;
  return InvalidArgument("cannot tell the format of '" + path + "' (name it .pt, .pth, .bin, .safetensors or .gguf, or give the format)");
}

Result<DType> ParseCastDType(const std::string& name) {
  static const std::map<std::string, DType> kCasts = {
      {"bf16", DType::kBFloat16}, {"bfloat16", DType::kBFloat16}, {"fp16", DType::kFloat16},
      {"float16", DType::kFloat16}, {"fp32", DType::kFloat32}, {"float32", DType::kFloat32}};
  auto it = kCasts.find(name);
  if (it == kCasts.end()) return InvalidArgument("dtype must be bf16, fp16 or fp32 (or bfloat16, float16, float32), not '" + name + "'");
  return it->second;
}

Result<ConsolidateReport> Consolidate(const std::string& checkpoint, const std::string& out,
                                      const ConsolidateOptions& options) {
  // Refused before reading: the file would be written whole under OUT.partial and then fail to
  // replace the folder.
  if (IsDirectory(out)) return InvalidArgument(out + " is a folder: name the file to write in it (" + JoinPath(out, "model.pt") + ")");
  // Names are UTF-8 (the manifest's are): a prefix that is too, stripped where it matches, leaves
  // each name cut at a character's start; one that ends inside a character would not, and .pt
  // and GGUF readers fail on what is left.
  if (!IsUtf8(options.strip_prefix)) {
    return InvalidArgument("--strip-prefix '" + Utf8OrReplaced(options.strip_prefix) +
                           "' is not valid UTF-8 (it ends inside a character?): names are UTF-8, and a prefix cut "
                           "from them must be whole characters");
  }
  SC_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(checkpoint));
  SC_RETURN_IF_ERROR(RefuseOutputInCheckpoint(out, reader->dir()));
  MadeDirs made(DirName(out));  // removed again if this fails
  SC_RETURN_IF_ERROR(made.status());
  SC_ASSIGN_OR_RETURN(OutputLock held, OutputLock::Acquire(out));
  const Manifest& m = reader->manifest();
  ConsolidateReport report;
  report.checkpoint = reader->dir();
  std::vector<Selected> selected;
  // Entry names are unique (the manifest is validated): only a stripped prefix can make two equal.
  const bool renames = !options.strip_prefix.empty();
  std::unordered_map<std::string, const std::string*> names;  // output name -> entry; hashed: a hundred thousand entries
  if (renames) names.reserve(m.entries.size());
  selected.reserve(m.entries.size());
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    if (!options.include.empty() && !Matches(options.include, e.name)) continue;
    if (Matches(options.exclude, e.name)) continue;
    const std::string name = OutputName(options, e.name);
    if (name.empty()) return InvalidArgument("entry '" + e.name + "' becomes an empty name after --strip-prefix");
    // "model" for "model.": every name would start with '.', which transformers and torch then
    // take for no parameter of the model (from_pretrained initialized every weight at random).
    if (renames && name[0] == '.' && name.size() < e.name.size()) {
      return InvalidArgument("--strip-prefix '" + options.strip_prefix + "' leaves entry '" + e.name + "' as '" + name +
                             "', a name starting with '.': did you mean --strip-prefix '" + options.strip_prefix + ".'?");
    }
    if (renames) {
      auto [taken, fresh] = names.emplace(name, &e.name);
      if (!fresh) {
        return InvalidArgument("entries '" + *taken->second + "' and '" + e.name + "' both become '" + name +
                               "' after --strip-prefix");
      }
    }
    DType dtype = options.cast && IsFloatingDType(e.dtype) ? *options.cast : e.dtype;
    uint64_t bytes = static_cast<uint64_t>(NumBytes(e.shape, DTypeSize(dtype)).value());
    selected.push_back(Selected{i, name, dtype, e.shape, bytes});
    report.tensor_bytes += bytes;
  }
  WarnOfGlobsMatchingNothing(m, options);
  // Tied weights: in a .pt, one storage under both names (as torch.save writes them).
  if (options.format == ExportFormat::kTorch) {
    const std::vector<int64_t> aliases = EntryAliases(m);
    std::vector<int64_t> selected_of(m.entries.size(), -1);  // entry -> its selected index, when stored
    for (size_t k = 0; k < selected.size(); ++k) {
      Selected& s = selected[k];
      const int64_t canonical = aliases[s.entry] >= 0 ? selected_of[static_cast<size_t>(aliases[s.entry])] : -1;
      if (canonical >= 0 && selected[static_cast<size_t>(canonical)].dtype == s.dtype) {
        s.alias = canonical;
        report.tensor_bytes -= s.bytes;
        report.aliases++;
      } else {
        selected_of[s.entry] = static_cast<int64_t>(k);
      }
    }
  }
  // A state dict of values only (an optimizer's before its first step, or --include of a
  // scheduler's values), or of nothing at all (torch.save({}) imported), is a .pt still; with an
  // --include that selects nothing, or in a format of tensors only, an empty selection is a
  // mistake to report.
  std::vector<size_t> values_selected;  // the global values a .pt holds (TorchStateDictPickle reads them)
  for (size_t b = 0; b < m.blobs.size(); ++b) {
    if (m.blobs[b].scope == BlobScope::kGlobal && !OutputName(options, m.blobs[b].name).empty()) values_selected.push_back(b);
  }
  // A prefix no selected name starts with, of a tensor or (in a .pt) of a value, is a typo (or the
  // wrong checkpoint): said, not silently written under the full names.
  if (renames && (!selected.empty() || !values_selected.empty()) &&
      std::none_of(selected.begin(), selected.end(), [&](const Selected& s) { return s.name != m.entries[s.entry].name; }) &&
      (options.format != ExportFormat::kTorch ||
       std::none_of(values_selected.begin(), values_selected.end(),
                    [&](size_t b) { return OutputName(options, m.blobs[b].name) != m.blobs[b].name; }))) {
    SC_LOG(kWarn) << "--strip-prefix '" << options.strip_prefix << "' starts no selected name (the first is '"
                  << (selected.empty() ? m.blobs[values_selected.front()].name : m.entries[selected.front().entry].name)
                  << "'): names are written as they are";
  }
  const bool values_only = options.format == ExportFormat::kTorch &&
                           (!values_selected.empty() || (options.include.empty() && (!m.blobs.empty() || m.entries.empty())));
  if (selected.empty() && !values_only) return InvalidArgument("no entry of " + reader->dir() + " is selected");
  report.entries = selected.size();
  if (selected.size() < m.entries.size()) {  // a part of the checkpoint: read only its bytes
    std::vector<size_t> entries;
    entries.reserve(selected.size());
    for (const Selected& s : selected) entries.push_back(s.entry);
    reader->ReadOnly(entries);
  }
  SC_RETURN_IF_ERROR(reader->CheckWantedFiles(options.format == ExportFormat::kTorch ? values_selected : std::vector<size_t>{}));
  reader->ReadFirstWindowsAhead();  // while the output's header is made
  uint64_t done = 0;
  auto progress = [&](uint64_t n) {
    done += n;
    return options.progress ? options.progress(done, report.tensor_bytes) : Status::Ok();
  };

  if (options.format == ExportFormat::kTorch) {
    SC_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(out, report.tensor_bytes));
    ZipWriter zip(file.get());
    Result<std::string> tree = TorchStateDictPickle(*reader, options, selected, &report);
    if (!tree.ok() && tree.status().code() == Code::kInvalidArgument) {  // the names' nesting: say whose
      return tree.status().WithContext("the state dict of " + reader->dir());
    }
    SC_ASSIGN_OR_RETURN(std::string pickle, std::move(tree));
    if (selected.empty() && report.values.empty() && !options.include.empty()) {  // selected, but none writable
      std::string skipped;
      for (const std::string& s : report.skipped) skipped += (skipped.empty() ? "" : "; ") + s;
      return InvalidArgument("nothing of " + reader->dir() + " that --include selects can be written to a .pt: " + skipped);
    }
    const std::string root = "archive/";
    SC_RETURN_IF_ERROR(zip.AddRecord(root + "data.pkl", pickle));
    SC_RETURN_IF_ERROR(zip.AddRecord(root + "byteorder", "little"));
    std::vector<size_t> all;  // each storage once
    for (size_t k = 0; k < selected.size(); ++k) {
      if (selected[k].alias < 0) all.push_back(k);
    }
    SC_RETURN_IF_ERROR(StreamEntries(
        *reader, selected, all, options.window_bytes,
        [&](size_t k) { return zip.BeginRecord(root + "data/" + std::to_string(k), selected[k].bytes); },
        [&](const void* p, size_t n) {
          SC_RETURN_IF_ERROR(progress(n));
          return zip.Append(p, n);
        },
        [&](size_t) { return zip.EndRecord(); }));
    SC_RETURN_IF_ERROR(zip.AddRecord(root + "version", "3\n"));
    SC_RETURN_IF_ERROR(zip.Finish());
    // A stop asked for since the last bytes, the fsync included: before the file is published.
    SC_RETURN_IF_ERROR(file->Finish());
    SC_RETURN_IF_ERROR(progress(0));
    SC_RETURN_IF_ERROR(file->Publish());
    report.files.push_back(out);
    report.sha256.push_back(file->sha256());
  } else if (options.format == ExportFormat::kGguf) {
    // Header first (it refuses a dtype or name GGUF cannot hold before a byte is written), then
    // each tensor's bytes padded to the alignment.
    ListValuesNotWritten(m, options, "GGUF holds tensors and its header's keys only", &report);
    std::vector<GgufTensorInfo> infos;
    for (const Selected& s : selected) infos.push_back(GgufTensorInfo{s.name, s.dtype, s.shape});
    SC_ASSIGN_OR_RETURN(std::string header, EncodeGgufHeader(options.gguf_metadata, infos));
    SC_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(out, report.tensor_bytes));
    SC_RETURN_IF_ERROR(file->Write(header.data(), header.size()));
    std::vector<size_t> all(selected.size());
    for (size_t k = 0; k < all.size(); ++k) all[k] = k;
    static const char kZeros[kGgufAlignment] = {};
    SC_RETURN_IF_ERROR(StreamEntries(
        *reader, selected, all, options.window_bytes, [&](size_t) { return Status::Ok(); },
        [&](const void* p, size_t n) {
          SC_RETURN_IF_ERROR(progress(n));
          return file->Write(p, n);
        },
        [&](size_t k) { return file->Write(kZeros, GgufPadding(selected[k].bytes)); }));
    SC_RETURN_IF_ERROR(file->Finish());
    SC_RETURN_IF_ERROR(progress(0));
    SC_RETURN_IF_ERROR(file->Publish());
    report.files.push_back(out);
    report.sha256.push_back(file->sha256());
  } else {
    // Greedy shards in entry order; a tensor larger than the limit gets a shard of its own.
    std::vector<std::vector<size_t>> shards(1);
    uint64_t in_shard = 0;
    for (size_t k = 0; k < selected.size(); ++k) {
      if (options.max_shard_bytes > 0 && in_shard > 0 && in_shard + selected[k].bytes > options.max_shard_bytes) {
        shards.emplace_back();
        in_shard = 0;
      }
      shards.back().push_back(k);
      in_shard += selected[k].bytes;
    }
    // All in one shard: one file under OUT's name and no index, as transformers' save_pretrained
    // writes a model under its shard size.
    const bool sharded = shards.size() > 1;
    // The metadata of the safetensors file this checkpoint was imported from comes back.
    std::map<std::string, std::string> header_metadata = {{"source", "shardckpt"}};
    if (auto kept = m.created.user.find(kSafetensorsMetadataKey); kept != m.created.user.end()) {
      nlohmann::json json = nlohmann::json::parse(kept->second, nullptr, false);
      if (json.is_object()) {
        for (const auto& [key, value] : json.items()) {
          if (value.is_string() && key != "format") header_metadata[key] = value.get<std::string>();
        }
      }
    }
    ListValuesNotWritten(m, options, "safetensors holds tensors only", &report);
    // Every shard's header before any file: a dtype or name safetensors cannot hold is refused
    // with nothing written, and a later failure (a full disk) removes the shards already done.
    std::vector<std::string> headers;
    for (const std::vector<size_t>& shard : shards) {
      std::vector<SafetensorsEntry> entries;
      for (size_t k : shard) entries.push_back(SafetensorsEntry{selected[k].name, selected[k].dtype, selected[k].shape, 0, 0});
      SC_ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, header_metadata));
      headers.push_back(std::move(header));
    }
    // Every file is written and fsynced under its .partial name first and renamed into place
    // only when all are: a failure while writing leaves the previous output whole.
    // (name, shard file) in tensor order; written as text, not as an ordered_json, which finds
    // each key by a linear search (json_keys.h).
    std::vector<std::pair<std::string_view, std::string>> weight_map;
    if (sharded) weight_map.reserve(selected.size());
    std::vector<std::unique_ptr<OutputFile>> finished;
    for (size_t s = 0; s < shards.size(); ++s) {
      std::string path = out;
      if (sharded) {
        char name[64];
        std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", s + 1, shards.size());
        path = JoinPath(DirName(out), Stem(out) + name);
      }
      const std::string& header = headers[s];
      uint64_t shard_bytes = header.size();
      for (size_t k : shards[s]) shard_bytes += selected[k].bytes;
      SC_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(path, shard_bytes));
      SC_RETURN_IF_ERROR(file->Write(header.data(), header.size()));
      const std::string base = BaseName(path);
      SC_RETURN_IF_ERROR(StreamEntries(
          *reader, selected, shards[s], options.window_bytes,
          [&](size_t k) {
            if (sharded) weight_map.emplace_back(selected[k].name, base);
            return Status::Ok();
          },
          [&](const void* p, size_t n) {
            SC_RETURN_IF_ERROR(progress(n));
            return file->Write(p, n);
          },
          [&](size_t) { return Status::Ok(); }));
      SC_RETURN_IF_ERROR(file->Finish());
      finished.push_back(std::move(file));
    }
    // The output this one replaces: a set of shards of the same stem (its index lists them), or,
    // for a sharded set, a single file of the same name. Left beside the new one they would be
    // loaded in its place (a loader looks for model.safetensors first) or lie there unlisted.
    const std::string index_path = JoinPath(DirName(out), Stem(out) + ".safetensors.index.json");
    const std::vector<std::string> previous = PreviousShards(index_path, Stem(out));
    // A new shard that takes an old shard's name (the same count of shards) changes the old set
    // as it is renamed in: its index goes first, or a crash partway through the renames left old
    // and new shards under it, which passed every check and imported as one model. Shards of
    // other names leave the old set whole until the new index replaces its index, atomically.
    // A stop asked for since the last bytes, or no room for the sidecars: before anything of the
    // old set is touched.
    SC_RETURN_IF_ERROR(progress(0));
    for (const std::unique_ptr<OutputFile>& file : finished) SC_RETURN_IF_ERROR(file->PrepareSidecar());
    if (sharded && std::any_of(finished.begin(), finished.end(), [&](const std::unique_ptr<OutputFile>& f) {
          return std::find(previous.begin(), previous.end(), BaseName(f->path())) != previous.end();
        })) {
      RemoveOutputFile(index_path);
    }
    OutputSet written;
    for (size_t f = 0; f < finished.size(); ++f) {
      const std::unique_ptr<OutputFile>& file = finished[f];
      Status published = file->Publish();
      if (file->published()) written.Add(file->path());
      if (!published.ok() && f > 0) {
        // Renames cannot be made atomic as a set: the files renamed so far replaced theirs and
        // are removed again, so a set of this name in the folder is now incomplete, not mixed.
        return published.WithContext("publishing file " + std::to_string(f + 1) + " of " + std::to_string(finished.size()) +
                                     " (the earlier ones of this set are removed: export again)");
      }
      SC_RETURN_IF_ERROR(published);
      report.files.push_back(file->path());
      report.sha256.push_back(file->sha256());
    }
    if (sharded) {
      // The keys transformers' save_pretrained writes (json.dumps(index, indent=2)), the weight
      // map in tensor order.
      int64_t parameters = 0;
      for (const Selected& e : selected) parameters += NumElements(e.shape).value();  // as stored: tied ones per name
      std::string index = "{\n  \"metadata\": {\n    \"total_parameters\": " + std::to_string(parameters) +
                          ",\n    \"total_size\": " + std::to_string(report.tensor_bytes) + "\n  },\n  \"weight_map\": {";
      for (size_t k = 0; k < weight_map.size(); ++k) {
        index += (k == 0 ? "\n    " : ",\n    ") + nlohmann::json(weight_map[k].first).dump() + ": " +
                 nlohmann::json(weight_map[k].second).dump();
      }
      index += weight_map.empty() ? "}\n}\n" : "\n  }\n}\n";
      const std::string index_sum = Sha256Hex(index);
      Status indexed = WriteFileAtomic(index_path, index, "export.index");
      if (indexed.ok()) {
        written.Add(index_path);  // removed with the shards if its .sha256 cannot be written
        indexed = WriteSidecar(index_path, index_sum);
      }
      if (!indexed.ok()) return indexed.WithContext("the shards of this set are removed again: export again");
      report.files.push_back(index_path);
      report.sha256.push_back(index_sum);
    }
    written.Keep();
    for (const std::string& old : previous) {
      const std::string old_path = JoinPath(DirName(out), old);
      if (std::find(report.files.begin(), report.files.end(), old_path) == report.files.end()) RemoveOutputFile(old_path);
    }
    if (!sharded && !previous.empty()) RemoveOutputFile(index_path);
    if (sharded && PathExists(out)) RemoveOutputFile(out);
  }
  report.bytes_read = reader->stats().data_bytes_read;
  made.Keep();
  return report;
}

}  // namespace shardckpt
