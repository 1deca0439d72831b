#include "shardckpt/engine/core/load.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{4} << 30;
constexpr unsigned char kWanted = 1, kWantedWhole = 2, kWantedPart = 4;
// This rank's first whole piece of the entry is in device memory (the one a broadcast fills).
constexpr unsigned char kWholeOnDevice = 8;

std::string NameList(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 20; ++i) out += (i ? ", " : "") + ("'" + names[i] + "'");
  if (names.size() > 20) out += ", and " + std::to_string(names.size() - 20) + " more";
  return out;
}

// Copies one whole piece into another of the same entry, whichever memory each lives in.
Status CopyPiece(const TensorPiece& to, const TensorPiece& from) {
  const size_t bytes = static_cast<size_t>(from.bytes);
  if (to.space == MemorySpace::kHost && from.space == MemorySpace::kHost) {
    std::memcpy(to.data, from.data, bytes);
    return Status::Ok();
  }
  std::vector<unsigned char> bounce;
  const void* host = from.data;
  if (from.space == MemorySpace::kCuda) {
    SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(from.device));
    void* landing = to.data;
    if (to.space == MemorySpace::kCuda) {
      bounce.resize(bytes);
      landing = bounce.data();
    }
    SC_RETURN_IF_ERROR(copier->CopyToHostAsync(landing, from.data, bytes, 0));
    SC_RETURN_IF_ERROR(copier->WaitSlot(0));
    if (to.space == MemorySpace::kHost) return Status::Ok();
    host = landing;
  }
  SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(to.device));
  SC_RETURN_IF_ERROR(copier->CopyToDeviceAsync(to.data, host, bytes));
  return copier->Synchronize();
}

// Broadcasts an entry's bytes from `root`'s piece into every rank's `piece`. Device pieces go
// straight over `device_comm` (NCCL) when every rank's piece is on a device; otherwise through a
// host buffer. The return is the collective's status; a local copy's error goes to `*local`
// and never skips the broadcast, so every rank stays in step and the error is agreed on later.
Status BroadcastPiece(Communicator& comm, Communicator* device_comm, bool all_on_device, const TensorPiece& piece,
                      int root, Status* local) {
  const size_t bytes = static_cast<size_t>(piece.bytes);
  if (piece.space == MemorySpace::kHost) return comm.Broadcast(piece.data, bytes, root);
  if (all_on_device && device_comm != nullptr) return device_comm->Broadcast(piece.data, bytes, root);
  TensorPiece host = piece;
  std::vector<unsigned char> buffer(bytes);
  host.data = buffer.data();
  host.space = MemorySpace::kHost;
  if (comm.rank() == root && local->ok()) *local = CopyPiece(host, piece);
  SC_RETURN_IF_ERROR(comm.Broadcast(buffer.data(), bytes, root));
  if (comm.rank() != root && local->ok()) *local = CopyPiece(piece, host);
  return Status::Ok();
}

}  // namespace

std::function<std::string(const std::string&)> StripPrefix(const std::string& prefix) {
  return [prefix](const std::string& name) {
    return name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
  };
}

std::function<std::string(const std::string&)> AddPrefix(const std::string& prefix) {
  return [prefix](const std::string& name) { return prefix + name; };
}

Result<Manifest> ReadManifest(const std::string& dir, std::string* text_out) {
  const std::string path = JoinPath(dir, kManifestName);
  SC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(path, kMaxManifestBytes));
  SC_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(text, path));
  Status files = CheckDataFiles(m, [&](const std::string& name) { return FileSize(JoinPath(dir, name)); });
  if (!files.ok()) return files.WithContext(dir);
  if (text_out != nullptr) *text_out = std::move(text);
  return m;
}

Result<LoadReport> Load(Communicator& comm, const std::string& path, const ShardedState& targets,
                        const LoadOptions& options) {
  const int rank = comm.rank();
  const int world = comm.size();
  LoadReport report;

  // 1. One metadata read, on rank 0.
  std::string dir, text;
  Status read;
  Manifest manifest;
  // Held until every rank has read (the status agreement after the reads): retention leaves it.
  CheckpointHold hold;
  if (rank == 0) {
    Result<CheckpointHold> resolved = HoldCheckpoint(path);
    read = resolved.status();
    if (read.ok()) {
      hold = std::move(resolved).value();
      dir = hold.dir();
      read = Failpoint("load.read_manifest", "read " + JoinPath(dir, kManifestName));
    }
    if (read.ok()) {
      Result<Manifest> decoded = ReadManifest(dir, &text);
      read = decoded.status();
      if (read.ok()) manifest = std::move(decoded).value();
    }
  }
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, read, 0));
  SC_RETURN_IF_ERROR(BroadcastString(comm, &dir, 0));
  if (world > 1) {
    SC_RETURN_IF_ERROR(BroadcastString(comm, &text, 0));
    // Rank 0 validated these very bytes; the others only parse them.
    Status parsed;
    if (rank != 0) {
      const std::string manifest_path = JoinPath(dir, kManifestName);
      parsed = Failpoint("load.decode_manifest", "parse " + manifest_path);
      if (parsed.ok()) {
        Result<Manifest> decoded = DecodeValidatedManifest(text, manifest_path);
        parsed = decoded.status();
        if (parsed.ok()) manifest = std::move(decoded).value();
      }
    }
    // The next all-gather sizes its message by the manifest: every rank must hold one.
    SC_RETURN_IF_ERROR(AgreeOnStatus(comm, parsed));
  }
  report.path = dir;
  report.step = manifest.step;
  report.saved_world_size = manifest.world_size;

  // 2. Match names, check dtypes and shapes.
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    std::string name = options.rename ? options.rename(manifest.entries[i].name) : manifest.entries[i].name;
    by_name.emplace(std::move(name), i);
  }
  std::string wants(manifest.entries.size(), '\0');
  std::vector<long> entry_of_piece(targets.pieces().size(), -1);
  Status matched;
  for (size_t p = 0; p < targets.pieces().size(); ++p) {
    const TensorPiece& piece = targets.pieces()[p];
    auto it = by_name.find(piece.name);
    if (it == by_name.end()) {
      if (std::find(report.missing.begin(), report.missing.end(), piece.name) == report.missing.end()) {
        report.missing.push_back(piece.name);
      }
      continue;
    }
    const EntryRecord& e = manifest.entries[it->second];
    if (e.dtype != piece.dtype && matched.ok()) {
      matched = InvalidArgument("entry '" + e.name + "' is " + DTypeName(e.dtype) + " in the checkpoint but " +
                                DTypeName(piece.dtype) + " in the target (no silent casts)");
    }
    if (e.shape != piece.global_shape && matched.ok()) {
      matched = InvalidArgument("entry '" + e.name + "' has shape " + ShapeString(e.shape) +
                                " in the checkpoint but " + ShapeString(piece.global_shape) + " in the target");
    }
    entry_of_piece[p] = static_cast<long>(it->second);
    bool whole = Normalize(piece.layout, piece.global_shape).kind == LayoutKind::kReplicated;
    if (whole && !(wants[it->second] & kWantedWhole) && piece.space == MemorySpace::kCuda) {
      wants[it->second] |= kWholeOnDevice;
    }
    wants[it->second] |= whole ? (kWanted | kWantedWhole) : (kWanted | kWantedPart);
  }
  std::vector<std::string> all_wants;
  SC_RETURN_IF_ERROR(comm.AllGather(wants, &all_wants));
  std::vector<bool> wanted_any(manifest.entries.size(), false), wanted_whole_by_all(manifest.entries.size(), true);
  std::vector<bool> whole_on_device_everywhere(manifest.entries.size(), true);
  for (const std::string& w : all_wants) {
    for (size_t i = 0; i < manifest.entries.size(); ++i) {
      if (w[i] & kWanted) wanted_any[i] = true;
      if (!(w[i] & kWantedWhole) || (w[i] & kWantedPart)) wanted_whole_by_all[i] = false;
      if (!(w[i] & kWholeOnDevice)) whole_on_device_everywhere[i] = false;
    }
  }
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    if (!wanted_any[i]) report.unexpected.push_back(manifest.entries[i].name);
  }
  if (matched.ok() && options.strict && !report.missing.empty()) {
    matched = NotFound("not in checkpoint " + dir + ": " + NameList(report.missing));
  }
  if (matched.ok() && options.strict && !report.unexpected.empty()) {
    matched = InvalidArgument("checkpoint " + dir + " has entries no rank loads: " + NameList(report.unexpected) +
                              " (load with strict=false to skip them)");
  }
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, matched));

  // Entries everyone wants whole: one reader each, then a broadcast.
  std::vector<int> reader_of(manifest.entries.size(), -1);
  if (options.broadcast_replicated && world > 1) {
    int next = 0;
    for (size_t i = 0; i < manifest.entries.size(); ++i) {
      if (wanted_any[i] && wanted_whole_by_all[i]) reader_of[i] = next++ % world;
    }
  }

  // Device pieces need a device this process can use; refuse on every rank before any reads.
  Status devices;
  for (const TensorPiece& piece : targets.pieces()) {
    if (piece.space != MemorySpace::kCuda || !devices.ok()) continue;
    devices = CudaCopier(piece.device).status().WithContext("tensor '" + piece.name + "'");
  }
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, devices));

  // 3. Plan and read.
  ReadTargets read_targets;
  bool any_device_target = false;
  std::vector<WantedPiece> wanted;
  for (size_t p = 0; p < targets.pieces().size(); ++p) {
    if (entry_of_piece[p] < 0) continue;
    size_t entry = static_cast<size_t>(entry_of_piece[p]);
    if (reader_of[entry] >= 0 && reader_of[entry] != rank) continue;
    const TensorPiece& piece = targets.pieces()[p];
    DeviceCopier* copier = nullptr;
    if (piece.space == MemorySpace::kCuda) {
      copier = CudaCopier(piece.device).value();  // checked above
      any_device_target = true;
    }
    wanted.push_back(WantedPiece{entry, piece.layout, static_cast<uint32_t>(read_targets.base.size())});
    read_targets.base.push_back(static_cast<unsigned char*>(piece.data));
    read_targets.names.push_back(manifest.entries[entry].name);
    read_targets.copier.push_back(copier);
  }
  ChunkIndex index(&manifest);
  std::vector<CopyRequest> copies;
  PlanPieceCopies(manifest, index, wanted, &copies);
  // Blobs: every global one; this rank's own per-rank ones when the world size is unchanged.
  std::vector<std::pair<std::string, const BlobRecord*>> blob_reads;
  for (const BlobRecord& b : manifest.blobs) {
    if (b.scope == BlobScope::kGlobal) {
      blob_reads.emplace_back(b.name, &b);
    } else if (manifest.world_size == world) {
      if (b.rank == rank) blob_reads.emplace_back(b.name, &b);
    } else {
      BlobResult& result = report.blobs[b.name];
      result.available = false;
      result.reason = "per-rank blob saved by " + std::to_string(manifest.world_size) +
                      " ranks; this job has " + std::to_string(world) + ", so it is not restored";
    }
  }
  for (auto& [name, record] : blob_reads) {
    BlobResult& result = report.blobs[name];
    result.available = true;
    result.reason.clear();
    result.bytes.assign(record->bytes, '\0');
    copies.push_back(CopyRequest{record->file, record->offset, record->bytes,
                                 static_cast<uint32_t>(read_targets.base.size()), 0});
    read_targets.base.push_back(reinterpret_cast<unsigned char*>(result.bytes.data()));
    read_targets.names.push_back("blob " + name);
    read_targets.copier.push_back(nullptr);
  }
  ReadPlan plan = CoalesceReads(std::move(copies), options.plan);
  report.bytes_wanted = plan.bytes_wanted;
  Status loaded;
  {
    // Size the staging ring to the plan: a few large buffers for large extents, many small ones
    // (so many reads in flight) when resharding cuts the reads into row segments.
    uint64_t largest = kBlockSize;
    for (const ReadExtent& e : plan.extents) largest = std::max(largest, e.length);
    const uint64_t budget = options.staging_buffers * options.plan.max_extent;
    size_t buffers = static_cast<size_t>(std::clamp<uint64_t>(budget / largest, options.staging_buffers, 128));
    Result<std::unique_ptr<BufferPool>> pool =
        BufferPool::Create(buffers, largest, StagingHostAllocator(any_device_target));
    loaded = pool.status();
    if (loaded.ok()) {
      IoOptions io_options = options.io;
      io_options.queue_depth = std::max<size_t>(io_options.queue_depth, buffers + 1);
      std::unique_ptr<IoEngine> io = CreateIoEngine(io_options);
      loaded = ExecuteReadPlan(io.get(), pool->get(), dir, manifest, plan, read_targets,
                               options.verify_checksums, &report.stats);
    }
  }
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, loaded));

  // 4. Replicated entries: reader broadcasts; extra whole copies on one rank are local copies.
  // A local copy's failure stops this rank's copies but not its broadcasts.
  Status copied;
  for (size_t entry = 0; entry < manifest.entries.size(); ++entry) {
    if (reader_of[entry] < 0) continue;
    const TensorPiece* first = nullptr;
    for (size_t p = 0; p < targets.pieces().size() && first == nullptr; ++p) {
      const TensorPiece& piece = targets.pieces()[p];
      if (entry_of_piece[p] == static_cast<long>(entry) &&
          Normalize(piece.layout, piece.global_shape).kind == LayoutKind::kReplicated) {
        first = &piece;
      }
    }
    if (first == nullptr || first->bytes == 0) continue;
    if (copied.ok()) copied = Failpoint("load.replicate", "copy of tensor '" + first->name + "'");
    SC_RETURN_IF_ERROR(BroadcastPiece(comm, options.device_comm, whole_on_device_everywhere[entry], *first,
                                      reader_of[entry], &copied));
    if (rank != reader_of[entry]) report.bytes_received += static_cast<uint64_t>(first->bytes);
    for (size_t p = 0; p < targets.pieces().size() && copied.ok(); ++p) {
      const TensorPiece& piece = targets.pieces()[p];
      if (entry_of_piece[p] == static_cast<long>(entry) && &piece != first) {
        copied = CopyPiece(piece, *first).WithContext("tensor '" + piece.name + "'");
      }
    }
  }
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, copied));
  return report;
}

}  // namespace shardckpt
