#include "shardckpt/engine/core/load.h"

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/helper_thread.h"
#include "shardckpt/engine/core/load_phases.h"
#include "shardckpt/engine/core/tied_targets.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/io_engine.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{4} << 30;

// Freeing a decoded manifest is a free per name, shape and chunk list: with 20,000 small tensors
// at 2 ranks, a tenth of the load's time (perf, 2026-12-04), paid before the caller could go on.
// A large one is freed on the helper thread; a small one here, where that costs less than the
// hand-off (and a process that loads only small checkpoints starts no thread).
void ReleaseOffThePath(Manifest manifest) {
  constexpr size_t kEntriesWorthHandingOff = 1024;
  if (manifest.entries.size() < kEntriesWorthHandingOff) return;
  auto held = std::make_shared<Manifest>(std::move(manifest));
  HelperJob job;
  // Moved in, so that the job holds the only reference whenever it runs. Refused, it is freed
  // here as the job goes: while the thread is busy (a removal can take seconds, and the next
  // load would allocate another manifest meanwhile) and while the process exits.
  job.run = [held = std::move(held)]() mutable { held.reset(); };
  job.awaited = false;
  job.only_if_idle = true;
  Status queued = RunOnHelperThread(std::move(job));
  if (queued.code() == Code::kInternal) {
    static std::once_flag logged;
    std::call_once(logged, [&] { SC_LOG(kWarn) << queued.message() << "; a load frees its manifest before it returns"; });
  }
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

Result<ReplicatedReads> ParseReplicatedReads(const std::string& text) {
  if (text == "auto") return ReplicatedReads::kAuto;
  if (text == "broadcast") return ReplicatedReads::kBroadcast;
  if (text == "every-rank") return ReplicatedReads::kEveryRank;
  return InvalidArgument("replicated reads '" + text + "': use auto, broadcast or every-rank");
}

Result<ManifestSharing> ParseManifestSharing(const std::string& text) {
  if (text == "auto") return ManifestSharing::kAuto;
  if (text == "root") return ManifestSharing::kRootSends;
  if (text == "every-rank") return ManifestSharing::kEveryRankParses;
  return InvalidArgument("manifest sharing '" + text + "': use auto, root or every-rank");
}

Result<Manifest> ReadManifest(const std::string& dir, std::string* text_out) {
  if (IsDcpFolder(dir)) {  // built from .metadata, and validated there
    SC_ASSIGN_OR_RETURN(Manifest m, ReadDcpFolder(dir));
    // Encoded only for a caller that wants the text (inspect, verify and the readers do not):
    // encoding refuses names a DCP folder may hold, such as ones not UTF-8.
    if (text_out != nullptr) {
      SC_ASSIGN_OR_RETURN(*text_out, EncodeManifest(m));
    }
    return m;
  }
  SC_ASSIGN_OR_RETURN(Manifest m, ReadManifestFile(JoinPath(dir, kManifestName), text_out));
  SC_RETURN_IF_ERROR(CheckDataFilesIn(dir, m.files));
  return m;
}

Status CheckDataFilesIn(const std::string& dir, const std::vector<FileRecord>& files) {
  Status checked = CheckDataFiles(files, [&](const std::string& name) { return FileSize(JoinPath(dir, name)); });
  return checked.ok() ? checked : checked.WithContext(dir);
}

Result<std::string> ReadManifestText(const std::string& path) {
  return ReadFileLimited(path, kMaxManifestBytes, /*prefer_direct=*/true);
}

Result<Manifest> ReadManifestFile(const std::string& path, std::string* text_out) {
  SC_ASSIGN_OR_RETURN(std::string text, ReadManifestText(path));
  SC_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(text, path, load_phases::ThisProcessDecodeThreads()));
  if (text_out != nullptr) *text_out = std::move(text);
  return m;
}

namespace {

// A DCP folder's byte items are torch.save zips of Python values: handed out as the values
// (DecodeDcpByteItem), or as unavailable with the reason (BlobResult::bytes keeps the zip).
// Every rank decodes the same bytes of the same manifest (rank 0's), so every rank reaches the
// same verdict.
void DecodeDcpByteItems(LoadReport* report) {
  for (auto& [name, blob] : report->blobs) {
    if (!blob.available) continue;
    Result<DcpByteItemBlob> value = DecodeDcpByteItem(blob.bytes, name);
    if (!value.ok()) {
      blob.available = false;
      blob.reason = "a DCP byte item holding more than plain values (" + value.status().message() +
                    "): shardckpt runs no pickled code (torch.distributed.checkpoint.load would unpickle it in full)";
      continue;
    }
    blob.bytes = std::move(value->bytes);
    blob.python_bytes = value->is_bytes;
  }
}

// A bytes object kept as a typed value (import or reshard of a DCP folder keeps its byte items
// so, for Python and consolidate) is handed out as its bytes, as a load of the folder itself
// does: a C++ program's blob survives export --format dcp and import. Only that exact form (the
// engine's compact JSON) is taken; the Python package stores its own bytes with another tag.
void DecodeTypedBytes(LoadReport* report) {
  static const std::string kTypedBytes = std::string(kPickleValueTag, 2) + R"({"__shardckpt__":"bytes","v":")";
  for (auto& [name, blob] : report->blobs) {
    if (!blob.available || blob.bytes.compare(0, kTypedBytes.size(), kTypedBytes) != 0) continue;
    Result<DcpByteItemBlob> value = DcpValueAsLoaded(blob.bytes);
    if (!value.ok() || !value->is_bytes) continue;
    blob.bytes = std::move(value->bytes);
    blob.python_bytes = true;
  }
}

}  // namespace

Result<LoadReport> Load(Communicator& comm, const std::string& path, const ShardedState& targets,
                        const LoadOptions& options) {
  using namespace load_phases;
  LoadReport report;
  PhaseClock clock(&report.phases);
  // 1-2. One metadata read, on rank 0, shared with the rest; each rank's own file is read
  // meanwhile where that pays.
  // Where the targets share memory (tied_targets.h), looked for beside the metadata phases.
  std::future<SharedTargets> first_look;
  try {
    first_look = std::async(std::launch::async, [&targets] { return FindSharedTargets(targets.pieces()); });
  } catch (const std::system_error&) {  // no thread to be had (a pids limit): looked for below
  }
  ManifestRead read = OpenManifestOnRoot(comm.rank(), comm.size(), path);
  SC_RETURN_IF_ERROR(ShareFolder(comm, path, options, &read));
  std::unique_ptr<FileReadAhead> ahead = StartReadAhead(read, comm.rank(), options);
  SC_RETURN_IF_ERROR(ShareManifestText(comm, &read));
  DecodeManifestText(comm.rank(), &read);
  clock.Lap("read_manifest");
  SC_RETURN_IF_ERROR(ShareManifest(comm, &read));
  clock.Lap("share_manifest");
  const Manifest& manifest = read.manifest;
  report.path = read.dir;
  report.every_rank_parsed_manifest = read.every_rank_parses;
  report.step = manifest.step;
  report.saved_world_size = manifest.world_size;
  // 3. Match names, check dtypes and shapes, choose who reads what every rank wants whole. Tied
  // targets that may get two values land in two buffers from here on (tied_targets.h).
  const TiedTargets tied(manifest, targets, options,
                         first_look.valid() ? first_look.get() : FindSharedTargets(targets.pieces()));
  const ShardedState& into = tied.targets();
  SC_ASSIGN_OR_RETURN(Match match, MatchEntries(comm, manifest, read.dir, into, options, &report, &tied));
  clock.Lap("match");
  // 4-5. Plan and read.
  // Each rank plans its own reads: a rank that sees the folder in memory, and verifies, cuts them
  // so that it verifies each while in its cache (ReadPlanOptions::memory_backed_max_extent).
  const bool verifies = options.verify_checksums &&
                        std::any_of(manifest.files.begin(), manifest.files.end(), [](const FileRecord& f) { return f.checksums; });
  const bool verified_from_memory = verifies && IsMemoryBacked(JoinPath(read.dir, kManifestName));
  ReadWork work = PlanReads(manifest, into, match, comm.rank(), comm.size(), options.plan, verified_from_memory, &report);
  report.bytes_wanted = work.plan.bytes_wanted;
  clock.Lap("plan");
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, ReadExtents(read.dir, manifest, work, options, &report.stats, ahead.get())));
  ahead.reset();  // its memory back to the spare before the broadcasts
  clock.Lap("read");
  // 6. Replicated entries: readers broadcast.
  SC_RETURN_IF_ERROR(ShareReplicated(comm, manifest, into, match, options, &report));
  clock.Lap("replicated");
  if (match.demand.tied_compared_anywhere) {
    SC_RETURN_IF_ERROR(AgreeOnStatus(comm, tied.Compare(read.dir)));
    clock.Lap("compare_tied");
  }
  const bool dcp = BuiltFromDcpFolder(manifest);
  ReleaseOffThePath(std::move(read.manifest));
  if (dcp) {
    DecodeDcpByteItems(&report);
  } else {
    DecodeTypedBytes(&report);
  }
  if (LogEnabled(LogLevel::kInfo)) {
    double seconds = 0;
    for (const PhaseTime& p : report.phases) seconds += p.seconds;
    SC_LOG(kInfo) << "loaded step " << report.step << " from " << report.path << " (saved by " << report.saved_world_size
                  << " rank(s)): this rank read " << report.stats.data_bytes_read << " bytes in " << seconds << " s";
  }
  return report;
}

}  // namespace shardckpt
