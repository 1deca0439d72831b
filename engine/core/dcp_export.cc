#include "shardckpt/engine/core/dcp_export.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/dcp_writer.h"
#include "shardckpt/engine/formats/output_file.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/formats/zip_writer.h"
#include "shardckpt/engine/model/utf8_text.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

// One item of a .distcp file: a byte item (blob) or one box of an entry.
struct Item {
  bool blob = false;
  size_t index = 0;  // into the manifest's blobs or entries
  std::vector<int64_t> lo, size;
};

// Calls fn(offsets, sizes) for sub-boxes of the box (lo, size) in the box's row-major order,
// each of at most `max_elements` elements (or one element): whole trailing dims, a run of one dim,
// single indices of the dims before it.
Status ForEachWindow(const std::vector<int64_t>& lo, const std::vector<int64_t>& size, int64_t max_elements,
                     const std::function<Status(const std::vector<int64_t>&, const std::vector<int64_t>&)>& fn) {
  const size_t n = size.size();
  if (n == 0) return fn(lo, size);
  std::vector<int64_t> inner(n, 1);
  for (size_t d = n - 1; d-- > 0;) inner[d] = inner[d + 1] * size[d + 1];
  size_t split = 0;
  while (inner[split] > max_elements) ++split;  // inner[n - 1] == 1 stops it
  const int64_t step = std::max<int64_t>(1, max_elements / inner[split]);
  std::vector<int64_t> index(split, 0), off(lo), sz(size);
  for (size_t d = 0; d < split; ++d) sz[d] = 1;
  while (true) {
    for (size_t d = 0; d < split; ++d) off[d] = lo[d] + index[d];
    for (int64_t a = 0; a < size[split]; a += step) {
      off[split] = lo[split] + a;
      sz[split] = std::min(step, size[split] - a);
      SC_RETURN_IF_ERROR(fn(off, sz));
    }
    size_t d = split;
    while (d > 0 && ++index[d - 1] == size[d - 1]) index[--d] = 0;
    if (d == 0) return Status::Ok();
  }
}

// One torch.save zip at the file's current position, as torch 2.x writes it; `data` streams
// record data/0 of `data_bytes` (none when it is null).
Result<DcpStorage> WriteTorchSave(OutputFile* file, const std::string& pickle, uint64_t data_bytes,
                                  const std::function<Status(ZipWriter&)>& data) {
  const uint64_t start = file->position();
  ZipWriter zip(file, start);
  const std::string root = "archive/";
  SC_RETURN_IF_ERROR(zip.AddRecord(root + "data.pkl", pickle));
  SC_RETURN_IF_ERROR(zip.AddRecord(root + ".format_version", "1"));
  SC_RETURN_IF_ERROR(zip.AddRecord(root + ".storage_alignment", "64"));
  SC_RETURN_IF_ERROR(zip.AddRecord(root + "byteorder", "little"));
  if (data) {
    SC_RETURN_IF_ERROR(zip.BeginRecord(root + "data/0", data_bytes));
    SC_RETURN_IF_ERROR(data(zip));
    SC_RETURN_IF_ERROR(zip.EndRecord());
  }
  SC_RETURN_IF_ERROR(zip.AddRecord(root + "version", "3\n"));
  SC_RETURN_IF_ERROR(zip.Finish());
  return DcpStorage{"", start, file->position() - start};
}

// The keys' order for state_dict_metadata: each byte item before the tensor import recorded as
// following it (kTorchValueOrderKey: a DCP folder's order, or a .pt's), the rest after the
// tensors; none recorded: tensors, then byte items.
std::vector<std::pair<bool, size_t>> StateDictOrder(const Manifest& m, const DcpMetadata& md) {
  std::vector<std::pair<bool, size_t>> order;
  auto recorded = m.created.user.find(kTorchValueOrderKey);
  if (recorded == m.created.user.end()) return order;
  const std::unordered_map<std::string, std::string> followers = DecodeValueOrder(recorded->second);
  if (followers.empty()) return order;
  std::unordered_map<std::string, std::vector<size_t>> before;  // tensor name -> byte items
  for (size_t b = 0; b < md.bytes.size(); ++b) {
    if (auto next = followers.find(md.bytes[b].fqn); next != followers.end()) before[next->second].push_back(b);
  }
  std::vector<bool> placed(md.bytes.size(), false);
  for (size_t t = 0; t < md.tensors.size(); ++t) {
    if (auto it = before.find(md.tensors[t].fqn); it != before.end()) {
      for (size_t b : it->second) {
        order.emplace_back(true, b);
        placed[b] = true;
      }
    }
    order.emplace_back(false, t);
  }
  for (size_t b = 0; b < md.bytes.size(); ++b) {
    if (!placed[b]) order.emplace_back(true, b);
  }
  return order;
}

// A file an export writes before its .metadata: a data file `__R_N.distcp`, its .sha256, and the
// temporary names of both (.partial, .tmp), or the .metadata's own temporary.
bool IsUnfinishedExportFile(const std::string& name) {
  if (name == std::string(kDcpMetadataName) + ".tmp") return true;
  static const std::regex kOwn(R"(__\d+_\d+\.distcp(\.partial|\.sha256(\.tmp)?)?)");
  return std::regex_match(name, kOwn);
}
}  // namespace

Result<DcpExportReport> ExportDcp(const std::string& checkpoint, const std::string& out, const DcpExportOptions& options) {
  SC_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(checkpoint));
  SC_RETURN_IF_ERROR(reader->CheckWantedFiles(AllBlobs(reader->manifest())));
  SC_RETURN_IF_ERROR(RefuseOutputInCheckpoint(out, reader->dir()));
  const Manifest& m = reader->manifest();
  MadeDirs made(DirName(WithoutTrailingSlashes(out)));  // removed again if this fails
  SC_RETURN_IF_ERROR(made.status());
  // Held before the folder is found new or empty: two exports to one folder both found it so.
  SC_ASSIGN_OR_RETURN(OutputLock held, OutputLock::Acquire(out));
  if (PathExists(out)) {
    if (!IsDirectory(out)) return InvalidArgument(out + " exists and is not a folder");
    SC_ASSIGN_OR_RETURN(std::vector<std::string> present, ListDir(out));
    // An export killed before its .metadata (an unfinished export, docs/format.md) left only
    // files of its own: cleared, so that a rerun succeeds as consolidate's does.
    // Ours only with a file torch's own writer never makes (its FileSystemWriter writes
    // __R_N.distcp and .metadata.tmp too, and a dcp.save in progress there is not ours to clear).
    const bool ours = std::any_of(present.begin(), present.end(), [](const std::string& name) {
      return EndsWith(name, ".distcp.partial") || EndsWith(name, ".distcp.sha256") || EndsWith(name, ".distcp.sha256.tmp");
    });
    if (ours && std::all_of(present.begin(), present.end(), IsUnfinishedExportFile)) {
      SC_LOG(kWarn) << out << " holds an unfinished export (no " << kDcpMetadataName << "): removing its "
                    << present.size() << " file(s) and exporting again";
      for (const std::string& name : present) {
        const std::string file = JoinPath(out, name);
        if (::unlink(file.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "remove " + file);
      }
      present.clear();
    }
    if (!present.empty()) return InvalidArgument(out + " is not empty: a DCP folder is exported into a new or empty folder");
  }
  // A failed export leaves the folder as it found it: removed if it made it, else empty.
  const bool fresh = !PathExists(out);
  SC_RETURN_IF_ERROR(MakeDirs(out));  // before the OutputSet: a path it cannot make is not removed
  OutputSet written(fresh ? out : "");
  DcpExportReport report;
  report.checkpoint = reader->dir();
  report.out = out;

  // Plan: per data file, its global blobs, then its boxes, each box once.
  std::map<uint32_t, std::vector<Item>> files;
  for (size_t b = 0; b < m.blobs.size(); ++b) {
    const BlobRecord& blob = m.blobs[b];
    if (blob.scope == BlobScope::kPerRank) {
      report.skipped.push_back(blob.name + ": a per-rank value (saved by rank " + std::to_string(blob.rank) +
                               "), which a DCP folder has no place for");
      continue;
    }
    files[blob.file].push_back(Item{true, b, {}, {}});
  }
  std::set<std::tuple<size_t, std::vector<int64_t>, std::vector<int64_t>>> seen;  // replicas
  for (size_t e = 0; e < m.entries.size(); ++e) {
    const EntryRecord& entry = m.entries[e];
    for (const ChunkRecord& c : entry.chunks) {
      for (const Region& r : LayoutRegions(c.layout, entry.shape)) {
        if (NumElements(r.size).value() == 0 || !seen.emplace(e, r.lo, r.size).second) continue;
        files[c.file].push_back(Item{false, e, r.lo, r.size});
        report.tensor_bytes += static_cast<uint64_t>(NumBytes(r.size, DTypeSize(entry.dtype)).value());
      }
    }
  }

  // Byte items of a DCP folder read in place that hold more than plain values: their zips.
  SC_ASSIGN_OR_RETURN(const auto opaque, DcpOpaqueByteItems(reader->dir(), m));
  DcpMetadata md;
  md.checkpoint_id = PythonPathText(out);  // torch pickles the path as a str
  // The nesting a DCP folder recorded goes back into planner_data (dcp_to_torch_save reads it).
  if (auto recorded = m.created.user.find(kTorchPathsKey); recorded != m.created.user.end()) {
    md.paths = DecodeStatePaths(recorded->second);
  }
  std::vector<size_t> tensor_of(m.entries.size());
  for (size_t e = 0; e < m.entries.size(); ++e) {
    tensor_of[e] = md.tensors.size();
    md.tensors.push_back(DcpTensor{m.entries[e].name, m.entries[e].dtype, m.entries[e].shape, {}});
  }
  std::vector<unsigned char> buffer;
  uint64_t done = 0;
  for (const auto& [f, items] : files) {
    const std::string name = "__" + std::to_string(f) + "_0.distcp";
    SC_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(JoinPath(out, name)));
    for (const Item& item : items) {
      if (item.blob) {
        const BlobRecord& blob = m.blobs[item.index];
        SC_ASSIGN_OR_RETURN(std::string bytes, reader->ReadBlob(blob));
        if (opaque.count(blob.name)) {
          // A DCP folder's byte item of more than plain values (a torch.Size, a dtype, a tuple
          // holding a tensor) is the torch.save zip torch wrote: copied as it is, so dcp.load
          // restores what it held (wrapped as a bytes value it came back as the zip's bytes).
          const uint64_t start = file->position();
          SC_RETURN_IF_ERROR(file->Write(bytes.data(), bytes.size()));
          md.bytes.push_back(DcpBytes{blob.name, DcpStorage{name, start, bytes.size()}});
          continue;
        }
        Result<std::string> pickle = PickleBlobValue(bytes);
        if (!pickle.ok()) {
          report.skipped.push_back(blob.name + ": " + pickle.status().message());
          continue;
        }
        SC_ASSIGN_OR_RETURN(DcpStorage storage, WriteTorchSave(file.get(), *pickle, 0, nullptr));
        storage.file = name;
        md.bytes.push_back(DcpBytes{blob.name, storage});
        continue;
      }
      const EntryRecord& entry = m.entries[item.index];
      const size_t element = DTypeSize(entry.dtype);
      const uint64_t bytes = static_cast<uint64_t>(NumBytes(item.size, element).value());
      const int64_t window = std::max<int64_t>(1, static_cast<int64_t>(options.window_bytes / element));
      auto stream = [&](ZipWriter& zip) {
        return ForEachWindow(item.lo, item.size, window, [&](const std::vector<int64_t>& lo, const std::vector<int64_t>& size) {
          buffer.resize(static_cast<size_t>(NumElements(size).value()) * element);
          Layout piece = Normalize(Layout::Box(lo, size), entry.shape);
          SC_RETURN_IF_ERROR(reader->ReadPiece(item.index, piece, buffer.data()).WithContext("entry '" + entry.name + "'"));
          done += buffer.size();
          if (options.progress) SC_RETURN_IF_ERROR(options.progress(done, report.tensor_bytes));
          return zip.Append(buffer.data(), buffer.size());
        });
      };
      SC_ASSIGN_OR_RETURN(DcpStorage storage,
                          WriteTorchSave(file.get(), PickleContiguousTensor(entry.dtype, item.size), bytes, stream));
      storage.file = name;
      md.tensors[tensor_of[item.index]].chunks.push_back(DcpChunk{item.lo, item.size, storage});
      ++report.chunks;
    }
    Status closed = file->Close();
    if (file->published()) written.Add(file->path());
    SC_RETURN_IF_ERROR(closed);
    report.files.push_back(JoinPath(out, name));
  }
  report.tensors = md.tensors.size();
  report.byte_items = md.bytes.size();
  md.order = StateDictOrder(m, md);
  // A stop asked for since the last bytes: before .metadata makes the folder a checkpoint.
  if (options.progress) SC_RETURN_IF_ERROR(options.progress(report.tensor_bytes, report.tensor_bytes));
  const std::string metadata = JoinPath(out, kDcpMetadataName);
  SC_RETURN_IF_ERROR(WriteFileAtomic(metadata, EncodeDcpMetadata(md), "export.dcp"));
  written.Keep();
  made.Keep();
  report.files.push_back(metadata);
  report.bytes_read = reader->stats().data_bytes_read;
  return report;
}

}  // namespace shardckpt
