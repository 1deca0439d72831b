#include "shardckpt/engine/convert.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "shardckpt/engine/checkpoint_reader.h"
#include "shardckpt/engine/commit.h"
#include "shardckpt/engine/offline_writer.h"
#include "shardckpt/engine/safetensors.h"
#include "shardckpt/engine/torch_pickle.h"
#include "shardckpt/engine/zip_reader.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

// Writes one full contiguous tensor as the pieces of `policy` for every rank.
Status WriteTensor(OfflineCheckpointWriter& out, const std::string& policy, int world, size_t index,
                   const std::string& name, DType dtype, const Shape& shape, const std::vector<unsigned char>& full) {
  const size_t element = DTypeSize(dtype);
  if (policy == "replicated") {
    return out.AddPiece(static_cast<int>(index % world), name, dtype, shape, Layout::Replicated(), full.data(), full.size());
  }
  std::vector<Region> whole = LayoutRegions(Layout::Replicated(), shape);
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

// A torch.save view (sizes, strides, offset into its storage) materialized contiguous.
Status ReadTorchTensor(const ZipReader& zip, const PickleTensor& t, std::vector<unsigned char>* out) {
  const std::string where = "tensor '" + t.name + "'";
  const size_t element = DTypeSize(t.dtype);
  SC_ASSIGN_OR_RETURN(int64_t numel, NumElements(t.sizes));
  if (t.strides.size() != t.sizes.size()) return DataLoss(where + ": sizes and strides differ in length");
  auto record = zip.records().find(zip.prefix() + "data/" + t.storage_key);
  if (record == zip.records().end()) return DataLoss(where + ": storage record data/" + t.storage_key + " is missing");
  if (t.storage_numel < 0 || static_cast<uint64_t>(t.storage_numel) * element != record->second.size) {
    return DataLoss(where + ": storage data/" + t.storage_key + " holds " + std::to_string(record->second.size) +
                    " bytes, not " + std::to_string(t.storage_numel) + " elements");
  }
  // The view's reach in its storage, overflow-checked: offset + sum((size-1) * stride).
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.sizes.size() && numel > 0; ++d) {
    int64_t reach;
    if (t.strides[d] < 0 || __builtin_mul_overflow(t.sizes[d] - 1, t.strides[d], &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return DataLoss(where + ": strides out of range");
    }
  }
  if (t.storage_offset < 0 || (numel > 0 && last >= t.storage_numel)) {
    return DataLoss(where + ": the view reaches past its storage");
  }
  out->resize(static_cast<size_t>(numel) * element);
  if (numel == 0) return Status::Ok();
  std::vector<unsigned char> span(static_cast<size_t>(last - t.storage_offset + 1) * element);
  SC_RETURN_IF_ERROR(zip.ReadAt(record->second.data_offset + static_cast<uint64_t>(t.storage_offset) * element,
                                span.data(), span.size()));
  // Odometer over the view's indices, gathering element by element runs of the last dim.
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

}  // namespace

Result<Layout> PolicyLayout(const std::string& policy, const Shape& shape, int world, int rank) {
  if (policy == "replicated") return Layout::Replicated();
  if (policy == "flat") return FlatShardLayout(shape, world, rank);
  if (policy == "dim0") return shape.empty() ? (rank == 0 ? Layout::Replicated() : Layout::FlatRange(1, 1))
                                             : ChunkLayout(shape, 0, world, rank);
  return InvalidArgument("unknown layout '" + policy + "' (flat, dim0 or replicated)");
}

Result<ConvertReport> ImportFile(const std::string& file, const std::string& root, const ConvertOptions& options) {
  SC_RETURN_IF_ERROR(PolicyLayout(options.layout, {1}, 1, 0).status());
  ConvertReport report;
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OfflineCheckpointWriter> out, OfflineCheckpointWriter::Begin(root, 0, options.world_size));
  std::vector<unsigned char> full;
  if (EndsWith(file, ".safetensors")) {
    SC_ASSIGN_OR_RETURN(uint64_t size, FileSize(file));
    if (size < 8) return DataLoss(file + ": too short for safetensors");
    std::string prefix(8, '\0');
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open " + file);
    auto read_at = [&](uint64_t offset, void* buf, size_t n) -> Status {
      size_t done = 0;
      while (done < n) {
        ssize_t k = ::pread(fd, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(offset + done));
        if (k <= 0) return DataLoss(file + ": short read at " + std::to_string(offset + done));
        done += static_cast<size_t>(k);
      }
      return Status::Ok();
    };
    Status status = read_at(0, prefix.data(), 8);
    uint64_t n = 0;
    std::memcpy(&n, prefix.data(), 8);
    if (status.ok() && (n > kMaxSafetensorsHeader || n > size - 8)) {
      status = DataLoss(file + ": invalid safetensors: header size " + std::to_string(n) + " is too large");
    }
    std::string header;
    if (status.ok()) {
      header.assign(n, '\0');
      status = read_at(8, header.data(), n);
    }
    Result<std::vector<SafetensorsEntry>> entries = status.ok() ? ParseSafetensorsHeader(header, size - 8 - n, file)
                                                                : Result<std::vector<SafetensorsEntry>>(status);
    if (entries.ok()) {
      for (size_t i = 0; i < entries->size() && status.ok(); ++i) {
        const SafetensorsEntry& e = (*entries)[i];
        full.resize(e.end - e.begin);
        status = read_at(8 + n + e.begin, full.data(), full.size());
        if (status.ok()) status = WriteTensor(*out, options.layout, options.world_size, i, e.name, e.dtype, e.shape, full);
        report.tensors++;
        report.bytes += full.size();
      }
    } else {
      status = entries.status();
    }
    ::close(fd);
    SC_RETURN_IF_ERROR(status);
  } else if (EndsWith(file, ".pt") || EndsWith(file, ".pth") || EndsWith(file, ".bin")) {
    SC_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(file));
    SC_ASSIGN_OR_RETURN(std::string pickle, zip.ReadRecord(zip.prefix() + "data.pkl", 256u << 20));
    Result<UnpickledStateDict> dict = UnpickleStateDict(pickle);
    if (!dict.ok()) return dict.status().WithContext(file);
    report.skipped = dict->skipped;
    for (size_t i = 0; i < dict->tensors.size(); ++i) {
      const PickleTensor& t = dict->tensors[i];
      Status read = ReadTorchTensor(zip, t, &full);
      if (!read.ok()) return read.WithContext(file);
      SC_RETURN_IF_ERROR(WriteTensor(*out, options.layout, options.world_size, i, t.name, t.dtype, t.sizes, full));
      report.tensors++;
      report.bytes += full.size();
      if (options.progress) options.progress(i + 1, dict->tensors.size());
    }
  } else {
    return InvalidArgument("cannot import '" + file + "': expected .pt, .pth or .safetensors");
  }
  SC_ASSIGN_OR_RETURN(report.path, out->Commit(MakeCreationInfo(1, "", "", {{"imported_from", file}})));
  return report;
}

Result<ConvertReport> Reshard(const std::string& checkpoint, const std::string& root, const ConvertOptions& options) {
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
      Layout layout = Layout::Replicated();
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
  for (const BlobRecord& b : m.blobs) {
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

}  // namespace shardckpt
