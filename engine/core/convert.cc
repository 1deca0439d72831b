#include "shardckpt/engine/core/convert.h"

#include <cstring>
#include <map>
#include <optional>

#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

// Writes one full contiguous tensor as the pieces of `policy` for every rank.
Status WriteTensor(OfflineCheckpointWriter& out, const std::string& policy, int world, size_t index,
                   const std::string& name, DType dtype, const Shape& shape, const std::vector<unsigned char>& full) {
  const size_t element = DTypeSize(dtype);
  if (policy == "replicated") {
    return out.AddPiece(static_cast<int>(index % world), name, dtype, shape, Layout::Whole(), full.data(), full.size());
  }
  std::vector<Region> whole = LayoutRegions(Layout::Whole(), shape);
  std::vector<unsigned char> piece;
  for (int r = 0; r < world; ++r) {
    SC_ASSIGN_OR_RETURN(Layout layout, PolicyLayout(policy, shape, world, r));
    SC_ASSIGN_OR_RETURN(int64_t count, ValidateLayout(layout, shape));
    piece.resize(static_cast<size_t>(count) * element);
    for (const Region& region : LayoutRegions(layout, shape)) {
      ForEachCopy(whole[0], region, [&](int64_t src, int64_t dst, int64_t n) {
        std::memcpy(piece.data() + dst * element, full.data() + src * element, static_cast<size_t>(n) * element);
      });
    }
    SC_RETURN_IF_ERROR(out.AddPiece(r, name, dtype, shape, layout, piece.data(), piece.size()));
  }
  return Status::Ok();
}

}  // namespace

Result<Layout> PolicyLayout(const std::string& policy, const Shape& shape, int world, int rank) {
  if (policy == "replicated") return Layout::Whole();
  if (policy == "flat") return FlatShardLayout(shape, world, rank);
  if (policy == "dim0") return shape.empty() ? (rank == 0 ? Layout::Whole() : Layout::FlatRange(1, 1))
                                             : ChunkLayout(shape, 0, world, rank);
  return InvalidArgument("unknown layout '" + policy + "' (flat, dim0 or replicated)");
}

namespace {

// The safetensors entries of `source` (header parsed and checked against the file's size).
Result<std::vector<SafetensorsEntry>> ReadSafetensorsIndex(const ByteSource& source, uint64_t* data_start) {
  const std::string& file = source.name();
  if (source.size() < 8) return DataLoss(file + ": too short for safetensors");
  uint64_t n = 0;
  SC_RETURN_IF_ERROR(source.ReadAt(0, &n, 8));
  if (n > kMaxSafetensorsHeader || n > source.size() - 8) {
    return DataLoss(file + ": invalid safetensors: header size " + std::to_string(n) + " is too large");
  }
  std::string header(n, '\0');
  SC_RETURN_IF_ERROR(source.ReadAt(8, header.data(), n));
  *data_start = 8 + n;
  return ParseSafetensorsHeader(header, source.size() - 8 - n, file);
}

Result<ConvertReport> ImportInto(const std::string& file, const std::string& root, const ConvertOptions& options) {
  SC_RETURN_IF_ERROR(PolicyLayout(options.layout, {1}, 1, 0).status());
  ConvertReport report;
  const bool safetensors = EndsWith(file, ".safetensors");
  if (!safetensors && !EndsWith(file, ".pt") && !EndsWith(file, ".pth") && !EndsWith(file, ".bin")) {
    return InvalidArgument("cannot import '" + file + "': expected .pt, .pth or .safetensors");
  }
  // The whole input is read and checked before the output root is touched, so a refused file
  // leaves nothing behind.
  SC_ASSIGN_OR_RETURN(ByteSource source, ByteSource::OpenFile(file));
  std::vector<SafetensorsEntry> entries;
  uint64_t data_start = 0;
  std::optional<ZipReader> zip;
  UnpickledStateDict dict;
  if (safetensors) {
    SC_ASSIGN_OR_RETURN(entries, ReadSafetensorsIndex(source, &data_start));
    for (const SafetensorsEntry& e : entries) {
      if (e.name.empty()) {
        return InvalidArgument(file + ": a tensor has an empty name (valid in safetensors, but a checkpoint entry "
                                      "needs a name): rename it before importing");
      }
    }
  } else {
    SC_ASSIGN_OR_RETURN(zip, ZipReader::Open(source));
    SC_ASSIGN_OR_RETURN(dict, ReadTorchStateDict(*zip));
    report.skipped = dict.skipped;
  }
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OfflineCheckpointWriter> out, OfflineCheckpointWriter::Begin(root, 0, options.world_size));
  std::vector<unsigned char> full;
  const size_t count = safetensors ? entries.size() : dict.tensors.size();
  for (size_t i = 0; i < count; ++i) {
    if (safetensors) {
      const SafetensorsEntry& e = entries[i];
      full.resize(e.end - e.begin);
      SC_RETURN_IF_ERROR(source.ReadAt(data_start + e.begin, full.data(), full.size()));
      SC_RETURN_IF_ERROR(WriteTensor(*out, options.layout, options.world_size, i, e.name, e.dtype, e.shape, full));
    } else {
      const PickleTensor& t = dict.tensors[i];
      Status read = ReadTorchTensor(*zip, t, &full);
      if (!read.ok()) return read.WithContext(file);
      SC_RETURN_IF_ERROR(WriteTensor(*out, options.layout, options.world_size, i, t.name, t.dtype, t.sizes, full));
    }
    report.tensors++;
    report.bytes += full.size();
    if (options.progress) options.progress(i + 1, count);
  }
  SC_ASSIGN_OR_RETURN(report.path, out->Commit(MakeCreationInfo(1, "", "", {{"imported_from", file}})));
  return report;
}

Result<ConvertReport> ReshardInto(const std::string& checkpoint, const std::string& root, const ConvertOptions& options) {
  SC_RETURN_IF_ERROR(PolicyLayout(options.layout, {1}, 1, 0).status());
  SC_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(checkpoint));
  const Manifest& m = reader->manifest();
  const int world = options.world_size;
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OfflineCheckpointWriter> out, OfflineCheckpointWriter::Begin(root, m.step, world));
  ConvertReport report;
  uint64_t total = 0;
  for (const EntryRecord& e : m.entries) total += static_cast<uint64_t>(NumBytes(e.shape, DTypeSize(e.dtype)).value());
  std::vector<unsigned char> piece;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    const size_t element = DTypeSize(e.dtype);
    // Each new piece is read exactly (the planner reads only its bytes): memory is one piece.
    for (int r = 0; r < world; ++r) {
      Layout layout = Layout::Whole();
      int writer = static_cast<int>(i % world);
      if (options.layout != "replicated") {
        SC_ASSIGN_OR_RETURN(layout, PolicyLayout(options.layout, e.shape, world, r));
        writer = r;
      } else if (r != writer) {
        continue;
      }
      SC_ASSIGN_OR_RETURN(int64_t count, ValidateLayout(layout, e.shape));
      piece.resize(static_cast<size_t>(count) * element);
      SC_RETURN_IF_ERROR(reader->ReadPiece(i, layout, piece.data()));
      SC_RETURN_IF_ERROR(out->AddPiece(writer, e.name, e.dtype, e.shape, layout, piece.data(), piece.size()));
      report.bytes += piece.size();
      if (options.progress) options.progress(report.bytes, total);
    }
    report.tensors++;
  }
  // A DCP folder's byte items whose pickle holds more than plain values are reported, not carried:
  // restoring them would mean running their pickle.
  std::map<std::string, std::string> opaque;
  if (IsDcpFolder(reader->dir())) {
    SC_ASSIGN_OR_RETURN(auto items, DcpOpaqueByteItems(reader->dir(), m));
    opaque.insert(items.begin(), items.end());
  }
  for (const BlobRecord& b : m.blobs) {
    if (opaque.count(b.name)) {
      report.skipped.push_back(b.name + " (a DCP byte item that is not plain values: " + opaque[b.name] + ")");
      continue;
    }
    if (b.scope == BlobScope::kPerRank && m.world_size != world) {
      report.skipped.push_back(b.name + "@rank" + std::to_string(b.rank));
      continue;
    }
    SC_ASSIGN_OR_RETURN(std::string bytes, reader->ReadBlob(b));
    SC_RETURN_IF_ERROR(out->AddBlob(b.scope == BlobScope::kPerRank ? b.rank : 0, b.name, b.scope, bytes));
  }
  CreationInfo created = m.created;
  created.user["resharded_from"] = reader->dir();
  SC_ASSIGN_OR_RETURN(report.path, out->Commit(created));
  return report;
}

// A conversion that fails leaves no root behind that it created: the writer removes its
// temporary folder, and this the folder and lock file it made for it.
Result<ConvertReport> IntoRoot(const std::string& root,
                               Result<ConvertReport> (*convert)(const std::string&, const std::string&, const ConvertOptions&),
                               const std::string& input, const ConvertOptions& options) {
  const bool fresh = !PathExists(root);
  Result<ConvertReport> report = convert(input, root, options);
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
