#include "shardckpt/engine/core/save_phases.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/core/shard_writer.h"
#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/model/name_index.h"
#include "shardckpt/engine/model/wire.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/direct_io.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt::save_phases {
namespace {

std::string StepFailed(int64_t step) { return "save of step " + std::to_string(step) + " failed"; }

// Writes the rank's file; its status is the report's.
WriteReport WriteShard(int rank, const std::string& temp_dir, const ShardedState& state,
                       const SavePlan& plan, const SaveOptions& options) {
  WriteReport report;
  const std::vector<bool>& pieces = plan.writes_piece[rank];
  const std::vector<bool>& blobs = plan.writes_blob[rank];
  bool any = std::find(pieces.begin(), pieces.end(), true) != pieces.end() ||
             std::find(blobs.begin(), blobs.end(), true) != blobs.end();
  auto run = [&]() -> Status {
    SC_RETURN_IF_ERROR(Failpoint("save.write_data", "write " + JoinPath(temp_dir, RankFileName(rank))));
    if (!any) return Status::Ok();
    bool from_device = false;
    for (size_t i = 0; i < pieces.size(); ++i) from_device |= pieces[i] && state.pieces()[i].space == MemorySpace::kCuda;
    StagingLease lease;
    BufferPool* pool = options.staging;
    if (pool == nullptr) {
      SC_ASSIGN_OR_RETURN(lease, StagingLease::Acquire(options.staging_buffers, options.staging_buffer_bytes,
                                                       StagingHostAllocator(from_device), options.keep_staging,
                                                       options.staging_buffers));
      pool = lease.pool();
    }
    IoOptions io_options = options.io;
    io_options.queue_depth = std::max<size_t>(io_options.queue_depth, pool->count() + 1);
    std::unique_ptr<IoEngine> io = CreateIoEngine(io_options);
    ShardFileWriter writer(io.get(), pool, options.always_stage, options.pieces_padded);
    writer.set_packing(ChunkPacking{options.pack_small_chunks});
    SC_RETURN_IF_ERROR(writer.Open(temp_dir, RankFileName(rank)));
    std::vector<DeviceCopier*> settled;  // devices whose queued work has finished
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!pieces[i]) continue;
      const TensorPiece& p = state.pieces()[i];
      auto append = [&]() -> Result<uint64_t> {
        if (p.space == MemorySpace::kHost) return writer.Append(p.data, static_cast<size_t>(p.bytes), DTypeSize(p.dtype));
        SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(p.device));
        if (std::find(settled.begin(), settled.end(), copier) == settled.end()) {
          SC_RETURN_IF_ERROR(copier->WaitForDeviceWork());
          settled.push_back(copier);
        }
        return writer.AppendFromDevice(p.data, static_cast<size_t>(p.bytes), copier, DTypeSize(p.dtype));
      };
      Result<uint64_t> offset = append();
      if (!offset.ok()) return offset.status().WithContext("tensor '" + p.name + "'");
      report.piece_offsets.emplace_back(i, *offset);
    }
    for (size_t j = 0; j < blobs.size(); ++j) {
      if (!blobs[j]) continue;
      const BlobItem& b = state.blobs()[j];
      // A blob's bytes are not in the snapshot's padded area: what follows them is not ours to write.
      SC_ASSIGN_OR_RETURN(uint64_t offset, writer.AppendStaged(b.bytes.data(), b.bytes.size()));
      report.blob_offsets.emplace_back(j, offset);
    }
    SC_ASSIGN_OR_RETURN(report.file, writer.Finish());
    report.wrote_file = true;
    return Status::Ok();
  };
  report.status = run();
  return report;
}

}  // namespace

// ---- Describe.
std::string HostName() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string DescribeRank(int64_t step, const std::string& host, const ShardedState& state) {
  WireWriter mine;
  mine.U64(static_cast<uint64_t>(step));
  mine.Str(host);
  mine.Str(EncodeStateDescription(state));
  return std::move(mine.bytes());
}

// ---- Plan.
Status CheckSteps(int64_t step, const std::vector<std::string>& gathered) {
  SC_RETURN_IF_ERROR(ValidateStep(step));
  for (size_t r = 0; r < gathered.size(); ++r) {
    WireReader reader(gathered[r]);
    int64_t theirs = static_cast<int64_t>(reader.U64());
    if (!reader.ok()) return Internal("truncated description from rank " + std::to_string(r));
    if (theirs != step) {
      return InvalidArgument("rank " + std::to_string(r) + " saves step " + std::to_string(theirs) +
                             " but rank 0 saves step " + std::to_string(step));
    }
  }
  return Status::Ok();
}

Result<Descriptions> DecodeDescriptions(const std::vector<std::string>& gathered) {
  Descriptions out;
  for (size_t r = 0; r < gathered.size(); ++r) {
    WireReader reader(gathered[r]);
    reader.U64();  // the step, checked by CheckSteps
    out.hosts.insert(reader.Str());
    std::string description = reader.Str();
    if (!reader.ok()) return Internal("truncated description from rank " + std::to_string(r));
    Result<RankDescription> d = DecodeRankDescription(description);
    if (!d.ok()) return d.status().WithContext("rank " + std::to_string(r));
    out.ranks.push_back(std::move(d).value());
  }
  return out;
}

namespace {

// A plan's id: random, positive (the reuse vote negates it), never 0 (no plan).
int64_t NewPlanId() {
  int64_t id = 0;
  while (id <= 0) {
    const std::string random = RandomId();
    id = static_cast<int64_t>(Checksum64(random.data(), random.size()) >> 1);
  }
  return id;
}

// With the root open for the save (LockRootForSave): plan (unless `cache` gives the plan), create
// the temp folder.
Status PrepareLocked(const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                     const SavePlanCache* cache, PlannedSave* planned) {
  if (cache != nullptr) {
    planned->described = cache->described;
    planned->plan = cache->plan;
    planned->plan_id = cache->plan_id;
    planned->reused = true;
  } else {
    SC_ASSIGN_OR_RETURN(Descriptions described, DecodeDescriptions(gathered));
    planned->described = std::make_shared<const Descriptions>(std::move(described));
    SC_ASSIGN_OR_RETURN(SavePlan plan, PlanSave(planned->described->ranks));
    planned->plan = std::make_shared<const SavePlan>(std::move(plan));
    planned->plan_id = NewPlanId();
  }
  planned->temp_name = TempDirName(step, RandomId());
  return MakeDir(JoinPath(root, planned->temp_name));
}

Status PlanLocked(const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                  const SaveOptions& options, const SavePlanCache* cache, PlannedSave* planned) {
  // Rank 0 applies retention and records the metrics: a rule or metric it cannot use is
  // refused now, not after every rank has written (a save would commit, then warn). A reused
  // plan's steps were compared by the reuse vote.
  SC_RETURN_IF_ERROR(cache != nullptr ? ValidateStep(step) : CheckSteps(step, gathered));
  SC_RETURN_IF_ERROR(ValidatePolicy(options.retention()));
  SC_RETURN_IF_ERROR(ValidateMetrics(options.metrics));
  SC_RETURN_IF_ERROR(ValidateUserMetadata(options.user_metadata));
  SC_RETURN_IF_ERROR(ValidateUserMetadata({{kTorchPathsKey, options.state_paths}}));
  SC_ASSIGN_OR_RETURN(RootLock lock, LockRootForSave(root, step));
  planned->lock = std::make_unique<RootLock>(std::move(lock));
  SC_RETURN_IF_ERROR(PrepareLocked(root, step, gathered, cache, planned));
  planned->plan_bytes =
      EncodePlanMessage(planned->temp_name, planned->plan_id, planned->reused ? nullptr : planned->plan.get());
  return Status::Ok();
}

PlannedSave PlanOnRootWith(int rank, const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                           const SaveOptions& options, const SavePlanCache* cache) {
  PlannedSave planned;
  if (rank != 0) return planned;
  Status status = PlanLocked(root, step, gathered, options, cache, &planned);
  if (!status.ok()) planned.status = status.WithContext(StepFailed(step) + " on rank 0");
  return planned;
}

}  // namespace

PlannedSave PlanOnRoot(int rank, const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                       const SaveOptions& options) {
  return PlanOnRootWith(rank, root, step, gathered, options, nullptr);
}

// ---- Reuse.
uint64_t DescriptionDigest(const std::string& host, const ShardedState& state, bool pack_small_chunks) {
  const uint64_t parts[3] = {Checksum64(host.data(), host.size()), DigestStateDescription(state), pack_small_chunks ? 1u : 0u};
  return Checksum64(parts, sizeof(parts));
}

Result<bool> AgreeOnReuse(Communicator& comm, int64_t step, uint64_t digest, const SavePlanCache* cache,
                          uint64_t values_digest, bool* values_differ, bool refused, bool* any_refused) {
  const bool mine = cache != nullptr && cache->plan_id > 0 && cache->plan != nullptr && cache->digest == digest &&
                    cache->world == comm.size() && (comm.rank() != 0 || cache->described != nullptr);
  const int64_t id = mine ? cache->plan_id : 0;
  const auto values = static_cast<int64_t>(values_digest >> 1);  // 63 bits: its negation fits
  // Maxima of each value and of its negation: every rank learns the least and the greatest.
  int64_t votes[8] = {id, -id, mine ? 0 : 1, step, -step, values, -values, refused ? 1 : 0};
  SC_RETURN_IF_ERROR(comm.AllReduceMaxInt64(votes, 8));
  if (values_differ != nullptr) *values_differ = votes[5] != -votes[6];
  if (any_refused != nullptr) *any_refused = votes[7] != 0;
  return votes[0] > 0 && votes[0] == -votes[1] && votes[2] == 0 && votes[3] == -votes[4];
}

namespace {

uint64_t ValueDigest(const BlobItem& b) {
  const uint64_t parts[2] = {Checksum64(b.name.data(), b.name.size()), Checksum64(b.bytes.data(), b.bytes.size())};
  return Checksum64(parts, sizeof(parts));
}

}  // namespace

uint64_t GlobalValuesDigest(const ShardedState& state) {
  uint64_t digest = 0;
  for (const BlobItem& b : state.blobs()) {
    if (b.scope == BlobScope::kGlobal) digest ^= ValueDigest(b);
  }
  return digest;
}

std::string EncodeGlobalValues(const ShardedState& state) {
  WireWriter w;
  for (const BlobItem& b : state.blobs()) {
    if (b.scope != BlobScope::kGlobal) continue;
    w.Str(b.name);
    w.U64(Checksum64(b.bytes.data(), b.bytes.size()));
  }
  return std::move(w.bytes());
}

Status GlobalValueConflicts(const std::vector<std::string>& gathered) {
  // name -> digest -> ranks holding that value; names in the order rank 0 (then others) gives them.
  std::map<std::string, std::map<uint64_t, std::vector<int>>> holders;
  std::vector<std::string> order;
  for (size_t r = 0; r < gathered.size(); ++r) {
    WireReader reader(gathered[r]);
    while (!reader.done()) {
      std::string name = reader.Str();
      const uint64_t digest = reader.U64();
      if (!reader.ok()) return Internal("truncated global values from rank " + std::to_string(r));
      auto& by_digest = holders[name];
      if (by_digest.empty()) order.push_back(name);
      by_digest[digest].push_back(static_cast<int>(r));
    }
  }
  for (const std::string& name : order) {
    const auto& by_digest = holders[name];
    if (by_digest.size() < 2) continue;
    std::vector<std::vector<int>> groups;
    for (const auto& [digest, ranks] : by_digest) groups.push_back(ranks);
    std::sort(groups.begin(), groups.end());  // the group of the lowest rank first
    std::string which;
    for (size_t g = 0; g < groups.size(); ++g) {
      which += (g == 0 ? "" : g + 1 == groups.size() ? " and " : ", ") + RankRanges(groups[g]);
    }
    return InvalidArgument("the global value '" + name + "' differs between ranks (" + which +
                           " hold different bytes), but a global value is saved once, from rank " +
                           std::to_string(groups[0][0]) + ": save a value that differs by rank per rank "
                           "(Python: shardckpt.PerRank(value); C++: BlobScope::kPerRank), or make it equal");
  }
  return Status::Ok();
}

std::string AgreedOptionsText(const SaveOptions& options) {
  // Names and values quoted as JSON strings: "a, b" and "a", "b" are different texts.
  auto quoted = [](const std::string& text) { return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  std::string text = "keep_last=" + std::to_string(options.keep_last) + " keep_best=" + std::to_string(options.keep_best);
  if (options.keep_best > 0) text += " metric=" + quoted(options.best_metric) + (options.best_higher_is_better ? " mode=max" : " mode=min");
  std::string metrics;
  for (const auto& [name, value] : options.metrics) metrics += (metrics.empty() ? "" : ", ") + quoted(name);
  text += " metrics={" + metrics + "}";
  std::string user;
  for (const auto& [key, value] : options.user_metadata) user += (user.empty() ? "" : ", ") + quoted(key) + ": " + quoted(value);
  return text + " user_metadata={" + user + "}";
}

namespace {

// What every rank must pass alike, as one message: AgreedOptionsText, each metric's name with
// its value's bits, and the root. Its checksum rides in the reuse vote; the message itself goes
// out only when the ranks' digests differ.
std::string EncodeSaveAgreement(const SaveOptions& options, const std::string& root) {
  WireWriter w;
  w.Str(AgreedOptionsText(options));
  w.U64(options.metrics.size());
  for (const auto& [name, value] : options.metrics) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    w.Str(name);
    w.U64(bits);
  }
  w.Str(root);
  return std::move(w.bytes());
}

bool DecodeSaveAgreement(const std::string& bytes, std::string* text, std::map<std::string, double>* metrics,
                         std::string* root) {
  WireReader r(bytes);
  *text = r.Str();
  for (uint64_t k = 0, n = r.U64(); k < n && r.ok(); ++k) {
    const std::string name = r.Str();
    const uint64_t bits = r.U64();
    double value = 0;
    std::memcpy(&value, &bits, sizeof(value));
    (*metrics)[name] = value;
  }
  *root = r.Str();
  return r.ok();
}

std::string ConflictText(const std::map<std::string, std::vector<int>>& ranks_of) {
  std::vector<std::pair<std::vector<int>, std::string>> groups;
  for (const auto& [text, ranks] : ranks_of) groups.emplace_back(ranks, text);
  std::sort(groups.begin(), groups.end());  // the group of rank 0 first
  std::string which;
  for (const auto& [ranks, text] : groups) which += (which.empty() ? "" : "; ") + RankRanges(ranks) + ": " + text;
  return which;
}

}  // namespace

Status OptionConflicts(const std::vector<std::string>& texts, const std::vector<std::map<std::string, double>>& metrics) {
  const std::string why = "), but they are recorded and applied once: pass every rank the same (a metric such as a loss "
                          "reduced across ranks first)";
  std::map<std::string, std::vector<int>> ranks_of;
  for (size_t r = 0; r < texts.size(); ++r) ranks_of[texts[r]].push_back(static_cast<int>(r));
  if (ranks_of.size() > 1) {
    return InvalidArgument("the save's retention rule, metrics or user metadata differ between ranks (" + ConflictText(ranks_of) + why);
  }
  if (metrics.empty()) return Status::Ok();
  for (const auto& [name, first] : metrics[0]) {  // the same names on every rank: the texts agree
    std::map<std::string, std::vector<int>> values_of;
    bool differ = false;
    for (size_t r = 0; r < metrics.size(); ++r) {
      auto it = metrics[r].find(name);
      const double value = it == metrics[r].end() ? std::nan("") : it->second;
      const bool same = std::isnan(value) ? std::isnan(first)
                                          : std::fabs(value - first) <= 1e-9 * std::max(std::fabs(value), std::fabs(first));
      differ |= !same;
      char number[32];
      std::snprintf(number, sizeof(number), "%.17g", value);
      values_of[name + "=" + number].push_back(static_cast<int>(r));
    }
    if (differ) return InvalidArgument("the metric '" + name + "' differs between ranks (" + ConflictText(values_of) + why);
  }
  return Status::Ok();
}

PlannedSave PlanOnRootFromCache(int rank, const std::string& root, int64_t step, const SaveOptions& options,
                                const SavePlanCache& cache) {
  return PlanOnRootWith(rank, root, step, {}, options, &cache);
}

void KeepPlan(SavePlanCache* cache, const PlannedSave& planned, uint64_t digest, int world) {
  if (cache == nullptr) return;
  if (!planned.decoded.ok()) {
    cache->Clear();
    return;
  }
  if (planned.reused) {
    cache->plans_reused++;
    return;
  }
  cache->plans_made++;
  cache->manifest.reset();  // built for the plan this one replaces
  cache->plan_id = planned.plan_id;
  cache->digest = digest;
  cache->world = world;
  cache->plan = planned.plan;
  cache->described = planned.described;
}

// ---- Broadcast the plan.
std::string EncodePlanMessage(const std::string& temp_name, int64_t plan_id, const SavePlan* plan) {
  WireWriter w;
  w.Str(temp_name);
  w.I64(plan_id);
  w.U64(plan != nullptr);
  if (plan != nullptr) w.Str(EncodeSavePlan(*plan));
  return std::move(w.bytes());
}

Status DecodePlanMessage(const std::string& bytes, int world, std::string* temp_name, int64_t* plan_id,
                         std::shared_ptr<const SavePlan>* plan) {
  WireReader reader(bytes);
  *temp_name = reader.Str();
  *plan_id = reader.I64();
  const bool carries_plan = reader.U64() != 0;
  std::string encoded = carries_plan ? reader.Str() : std::string();
  SC_RETURN_IF_ERROR(Failpoint("save.decode_plan", "save plan from rank 0"));
  if (!reader.ok()) return Internal("truncated save plan from rank 0");
  plan->reset();
  if (!carries_plan) return Status::Ok();
  SC_ASSIGN_OR_RETURN(SavePlan decoded, DecodeSavePlan(encoded, world));
  *plan = std::make_shared<const SavePlan>(std::move(decoded));
  return Status::Ok();
}

namespace {

// A non-root rank's reading of rank 0's broadcast.
Status ReadPlanMessage(int world, const SavePlanCache* cache, PlannedSave* planned) {
  SC_RETURN_IF_ERROR(
      DecodePlanMessage(planned->plan_bytes, world, &planned->temp_name, &planned->plan_id, &planned->plan));
  if (planned->plan != nullptr) return Status::Ok();
  // Rank 0 reused the plan only because every rank voted that it keeps this one.
  if (cache == nullptr || cache->plan == nullptr || cache->plan_id != planned->plan_id) {
    return Internal("rank 0 reused save plan " + std::to_string(planned->plan_id) + ", which this rank does not keep");
  }
  planned->plan = cache->plan;
  planned->reused = true;
  return Status::Ok();
}

}  // namespace

Status SharePlan(Communicator& comm, PlannedSave* planned, const SavePlanCache* cache) {
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, planned->status, 0));
  SC_RETURN_IF_ERROR(BroadcastString(comm, &planned->plan_bytes, 0));
  // A rank that cannot read the plan still joins the report gather, with its error as report.
  if (comm.rank() != 0) planned->decoded = ReadPlanMessage(comm.size(), cache, planned);
  return Status::Ok();
}

Result<PlannedSave> DecidePlan(Communicator& comm, const std::string& root, int64_t step, const ShardedState& state,
                               const SaveOptions& options) {
  const int rank = comm.rank();
  const std::string host = HostName();
  SavePlanCache* cache = options.plan_cache;
  const uint64_t digest = cache != nullptr ? DescriptionDigest(host, state, options.pack_small_chunks) : 0;
  bool values_differ = false, refused = false;
  // The options rank 0 applies are compared with the global values: one digest, one vote. The
  // root as an absolute path without trailing slashes: "ckpt", "ckpt/" and "$PWD/ckpt" agree
  // (a save each would otherwise take the allgather and warn).
  const std::string agreement = EncodeSaveAgreement(options, AbsoluteRoot(root));
  const uint64_t values_digest = GlobalValuesDigest(state) ^ Checksum64(agreement.data(), agreement.size());
  SC_ASSIGN_OR_RETURN(bool reuse, AgreeOnReuse(comm, step, digest, cache, values_digest, &values_differ,
                                               !state.refusal().ok(), &refused));
  if (refused) {  // every rank knows: one allgather to name each rank's refusal, on every rank alike
    return AgreeOnStatus(comm, state.CheckNothingRefused()).WithContext(StepFailed(step));
  }
  std::string rank0_root;  // set where this rank's root differs from rank 0's
  if (values_differ) {  // every rank knows: one allgather to name the value, on every rank alike
    WireWriter mine;
    mine.Str(EncodeGlobalValues(state));
    mine.Str(agreement);
    std::vector<std::string> all;
    SC_RETURN_IF_ERROR(comm.AllGather(std::move(mine.bytes()), &all));
    std::vector<std::string> values(all.size()), options_by_rank(all.size()), roots(all.size());
    std::vector<std::map<std::string, double>> metrics_by_rank(all.size());
    for (size_t r = 0; r < all.size(); ++r) {
      WireReader reader(all[r]);
      values[r] = reader.Str();
      const std::string theirs = reader.Str();
      if (!reader.ok() || !DecodeSaveAgreement(theirs, &options_by_rank[r], &metrics_by_rank[r], &roots[r])) {
        return Internal("truncated global values from rank " + std::to_string(r));
      }
    }
    // Each rank writes its file through its own root: one folder spelled otherwise works, other
    // folders make the commit miss that rank's file; said first, so that failure has its cause.
    for (size_t r = 1; r < roots.size(); ++r) {
      if (roots[r] != roots[0] && (rank == 0 || static_cast<int>(r) == rank)) {
        SC_LOG(kWarn) << "rank " << r << " saves into '" << roots[r] << "', rank 0 into '" << roots[0]
                      << "': unless both name one folder, the commit will miss rank " << r << "'s file";
      }
    }
    SC_RETURN_IF_ERROR(GlobalValueConflicts(values).WithContext(StepFailed(step)));
    SC_RETURN_IF_ERROR(OptionConflicts(options_by_rank, metrics_by_rank).WithContext(StepFailed(step)));
    if (roots[static_cast<size_t>(rank)] != roots[0]) rank0_root = roots[0];
  }
  PlannedSave planned;
  if (reuse) {
    planned = PlanOnRootFromCache(rank, root, step, options, *cache);
  } else {
    std::vector<std::string> gathered;
    SC_RETURN_IF_ERROR(comm.Gather(DescribeRank(step, host, state), &gathered, 0));
    planned = PlanOnRoot(rank, root, step, gathered, options);
  }
  SC_RETURN_IF_ERROR(SharePlan(comm, &planned, cache));
  KeepPlan(cache, planned, digest, comm.size());
  planned.rank0_root = std::move(rank0_root);  // not kept: the next save says its own
  return planned;
}

// ---- Write.
std::string EncodeWriteReport(const WriteReport& r) {
  WireWriter w;
  w.U64(static_cast<uint64_t>(r.status.code()));
  w.Str(r.status.message());
  w.U64(r.wrote_file);
  w.Str(r.file.name);
  w.U64(r.file.size);
  w.U64(r.file.table_offset);
  w.U64(r.file.table_page_sums.size());
  for (uint64_t s : r.file.table_page_sums) w.U64(s);
  for (const auto* list : {&r.piece_offsets, &r.blob_offsets}) {
    w.U64(list->size());
    for (auto [index, offset] : *list) {
      w.U64(index);
      w.U64(offset);
    }
  }
  return std::move(w.bytes());
}

Result<WriteReport> DecodeWriteReport(const std::string& bytes) {
  WireReader r(bytes);
  WriteReport out;
  Code code = static_cast<Code>(r.U64());
  std::string message = r.Str();
  out.status = code == Code::kOk ? Status::Ok() : Status(code, message);
  out.wrote_file = r.U64() != 0;
  out.file.name = r.Str();
  out.file.size = r.U64();
  out.file.table_offset = r.U64();
  uint64_t pages = r.U64();
  for (uint64_t i = 0; i < pages && r.ok(); ++i) out.file.table_page_sums.push_back(r.U64());
  for (auto* list : {&out.piece_offsets, &out.blob_offsets}) {
    uint64_t n = r.U64();
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      uint64_t index = r.U64();
      list->emplace_back(index, r.U64());
    }
  }
  if (!r.ok() || !r.done()) return Internal("truncated write report");
  return out;
}

WriteReport WriteRankFile(int rank, const std::string& temp_dir, const ShardedState& state,
                          const PlannedSave& planned, const SaveOptions& options) {
  if (!planned.decoded.ok()) {
    WriteReport report;
    report.status = planned.decoded;
    return report;
  }
  WriteReport report = WriteShard(rank, temp_dir, state, *planned.plan, options);
  if (!report.status.ok()) {
    report.status = report.status.WithContext("writing " + JoinPath(temp_dir, RankFileName(rank)));
  }
  return report;
}

// ---- Commit.
Result<std::vector<WriteReport>> CollectReports(int64_t step, const std::vector<std::string>& reports_bytes) {
  std::vector<WriteReport> reports;
  std::vector<Status> by_rank;
  for (size_t r = 0; r < reports_bytes.size(); ++r) {
    Result<WriteReport> decoded = DecodeWriteReport(reports_bytes[r]);
    if (!decoded.ok()) return decoded.status().WithContext("rank " + std::to_string(r));
    reports.push_back(std::move(decoded).value());
    by_rank.push_back(reports.back().status);
  }
  Status failed = MergeRankStatuses(by_rank);
  if (!failed.ok()) return failed.WithContext(StepFailed(step));
  return reports;
}

namespace {

// Whether the manifest's torch_paths are the state's paths (SaveOptions::state_paths): some were
// given, and the caller's user metadata holds no torch_paths of its own, which wins.
bool RecordsStatePaths(const SaveOptions& options) {
  return !options.state_paths.empty() && !options.user_metadata.count(kTorchPathsKey);
}

// The manifest's creation facts: the options' user metadata, and the state's paths under it.
CreationInfo SavedCreationInfo(const Descriptions& described, const SaveOptions& options) {
  CreationInfo created = MakeCreationInfo(static_cast<int>(described.hosts.size()), options.torch_version,
                                          options.git_commit, options.user_metadata);
  if (RecordsStatePaths(options)) created.user.emplace(kTorchPathsKey, options.state_paths);
  return created;
}

// Rank 0's paths leave out the leaves only other ranks hold; with a record that places some of a
// nested dict's leaves and not others, a consolidation split it (the optimizer state of another
// rank's parameters at the top as dotted names, which optimizer.load_state_dict of the nested
// part then silently lacked). Such a record is dropped: the .pt is flat, as without one.
void DropUnplacingStatePaths(const SaveOptions& options, Manifest* m) {
  if (!RecordsStatePaths(options)) return;
  std::vector<std::string> names;
  names.reserve(m->entries.size() + m->blobs.size());
  for (const EntryRecord& e : m->entries) names.push_back(e.name);
  for (const BlobRecord& b : m->blobs) names.push_back(b.name);
  const std::string unplaced = FirstNameLeftUnplaced(DecodeStatePaths(options.state_paths), names);
  if (unplaced.empty()) return;
  m->created.user.erase(kTorchPathsKey);
  LogOnce(LogLevel::kWarn, "save.state_paths_incomplete",
          "'" + unplaced + "' has no place in rank 0's state paths beside a nested dict whose name starts it (a leaf "
          "of another rank's state, or a key with a dot in it): the checkpoint records no nesting, and its "
          "consolidation writes dotted names at the top");
}

}  // namespace

Manifest BuildManifest(int64_t step, const Descriptions& described, const std::vector<WriteReport>& reports,
                       const SaveOptions& options, int64_t* total_bytes) {
  const int world = static_cast<int>(reports.size());
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.created = SavedCreationInfo(described, options);
  m.metrics = options.metrics;
  // Entries in name order, so manifests of equal states compare equal. Names are matched as
  // views of the descriptions and sorted as indices, and each entry's chunk list is sized before
  // it is filled: at tens of thousands of entries, the copies, moves and regrowth were most of
  // this function's time.
  std::vector<const PieceDescription*> first_piece;  // by entry, in order of first appearance
  NameIndex entry_of_name(described.ranks.empty() ? 0 : described.ranks[0].pieces.size(),
                          [&](uint32_t e) -> std::string_view { return first_piece[e]->name; });
  std::vector<uint32_t> chunk_count;
  // By rank, by described piece (kNone where not reported). Ranks of one job mostly describe
  // the same names at the same indices: the previous rank's entry at this index is tried first,
  // a name compare instead of a hash (millions of pieces at scale).
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<std::vector<uint32_t>> entry_of(world);
  const std::vector<uint32_t>* previous = nullptr;
  for (int r = 0; r < world; ++r) {
    const WriteReport& report = reports[r];
    if (!report.wrote_file) continue;
    const std::vector<PieceDescription>& pieces = described.ranks[r].pieces;
    entry_of[r].assign(pieces.size(), kNone);
    for (auto [index, offset] : report.piece_offsets) {
      const PieceDescription& p = pieces[index];
      uint32_t entry = previous != nullptr && index < previous->size() ? (*previous)[index] : kNone;
      if (entry == kNone || first_piece[entry]->name != p.name) {
        auto [found, fresh] = entry_of_name.TryEmplace(p.name, static_cast<uint32_t>(first_piece.size()));
        if (fresh) {
          first_piece.push_back(&p);
          chunk_count.push_back(0);
        }
        entry = found;
      }
      if (p.bytes != 0) chunk_count[entry]++;  // empty pieces (uneven splits) need no chunk
      entry_of[r][index] = entry;
    }
    previous = &entry_of[r];
  }
  std::vector<uint32_t> by_name(first_piece.size());
  for (uint32_t e = 0; e < by_name.size(); ++e) by_name[e] = e;
  auto name_less = [&](uint32_t a, uint32_t b) { return first_piece[a]->name < first_piece[b]->name; };
  if (!std::is_sorted(by_name.begin(), by_name.end(), name_less)) std::sort(by_name.begin(), by_name.end(), name_less);
  std::vector<uint32_t> position(by_name.size());
  m.entries.resize(by_name.size());
  for (uint32_t i = 0; i < by_name.size(); ++i) {
    const PieceDescription& p = *first_piece[by_name[i]];
    position[by_name[i]] = i;
    EntryRecord& entry = m.entries[i];
    entry.name = p.name;
    entry.dtype = p.dtype;
    entry.shape = p.shape;
    entry.chunks.reserve(chunk_count[by_name[i]]);
  }
  for (int r = 0; r < world; ++r) {
    const WriteReport& report = reports[r];
    if (!report.wrote_file) continue;
    uint32_t file = static_cast<uint32_t>(m.files.size());
    m.files.push_back(report.file);
    *total_bytes += static_cast<int64_t>(report.file.size);
    for (auto [index, offset] : report.piece_offsets) {
      const PieceDescription& p = described.ranks[r].pieces[index];
      if (p.bytes == 0) continue;
      m.entries[position[entry_of[r][index]]].chunks.push_back(
          ChunkRecord{file, offset, static_cast<uint64_t>(p.bytes), Normalize(p.layout, p.shape)});
    }
    for (auto [index, offset] : report.blob_offsets) {
      const BlobDescription& b = described.ranks[r].blobs[index];
      m.blobs.push_back(BlobRecord{b.name, b.scope, r, file, offset, static_cast<uint64_t>(b.bytes)});
    }
  }
  DropUnplacingStatePaths(options, &m);
  return m;
}

bool PlacedAlike(const std::vector<WriteReport>& now, const std::vector<WriteReport>& before) {
  if (now.size() != before.size()) return false;
  for (size_t r = 0; r < now.size(); ++r) {
    const WriteReport& a = now[r];
    const WriteReport& b = before[r];
    if (a.wrote_file != b.wrote_file || a.file.name != b.file.name || a.file.size != b.file.size ||
        a.file.table_offset != b.file.table_offset || a.file.checksums != b.file.checksums ||
        a.file.table_page_sums.size() != b.file.table_page_sums.size() || a.piece_offsets != b.piece_offsets ||
        a.blob_offsets != b.blob_offsets) {
      return false;
    }
  }
  return true;
}

namespace {

// The kept manifest, given this save's step, creation, metrics and checksum tables.
Status RefreshKeptManifest(int64_t step, const Descriptions& described, std::vector<WriteReport>&& reports,
                           const SaveOptions& options, KeptManifest* kept, int64_t* total_bytes) {
  Manifest& m = kept->head;
  m.step = step;
  m.created = SavedCreationInfo(described, options);
  // The same names and places as the save the plan was made by: its verdict on these paths holds.
  if (RecordsStatePaths(options) && options.state_paths != kept->recorded_state_paths) {
    m.created.user.erase(kTorchPathsKey);
    if (!kept->recorded_state_paths.empty()) {
      LogOnce(LogLevel::kWarn, "save.state_paths_changed",
              "the state's nesting changed while its leaves kept their names and places: this save records no "
              "nesting (its consolidation writes dotted names at the top) until a save makes a new plan");
    }
  }
  m.metrics = options.metrics;
  SC_RETURN_IF_ERROR(ValidateMetrics(m.metrics));
  size_t file = 0;
  *total_bytes = 0;
  for (WriteReport& report : reports) {
    if (!report.wrote_file) continue;
    m.files[file++].table_page_sums = report.file.table_page_sums;
    *total_bytes += static_cast<int64_t>(report.file.size);
  }
  kept->reports = std::move(reports);
  return Status::Ok();
}

// A manifest built for this save, validated and encoded; with a kept plan, kept for its next
// save (its entries and blobs as text, which the pieces view). Without one it is encoded in one
// piece, the head: no body copy.
Result<ManifestTextPieces> EncodeBuiltManifest(Manifest&& m, const PlannedSave& planned,
                                               std::vector<WriteReport>&& reports, SavePlanCache* cache,
                                               bool direct_io_likely, const SaveOptions& options) {
  if (cache == nullptr || cache->plan_id != planned.plan_id) {
    ManifestTextPieces whole;
    SC_RETURN_IF_ERROR(CheckBuiltManifestWhile(m, [&]() -> Status {
      SC_ASSIGN_OR_RETURN(whole.head, EncodeManifest(m));
      return Status::Ok();
    }));
    return whole;
  }
  auto kept = std::make_shared<KeptManifest>();
  SC_RETURN_IF_ERROR(CheckBuiltManifestWhile(m, [&]() -> Status {
    SC_ASSIGN_OR_RETURN(kept->body, EncodeManifestBody(m));
    return Status::Ok();
  }));
  SC_ASSIGN_OR_RETURN(ManifestTextPieces text, EncodeManifestWithBody(m, kept->body));
  kept->head_room = ManifestHeadRoom(text.head.size());
  // Sized now for the repeat saves' early writes with O_DIRECT, which then allocate nothing (a
  // buffered one needs none). Memory short of that fails no save: the commit below and an early
  // write each size it for themselves.
  if (direct_io_likely) {
    EnsureAlignedBytes(&cache->manifest_staging, ManifestAheadStagingBytes(kept->head_room, kept->body.text.size()))
        .IgnoreError();
  }
  kept->plan_id = planned.plan_id;
  kept->reports = std::move(reports);
  if (RecordsStatePaths(options) && m.created.user.count(kTorchPathsKey)) kept->recorded_state_paths = options.state_paths;
  m.entries = {};  // said by the body
  m.blobs = {};
  kept->head = std::move(m);
  cache->manifest = std::move(kept);
  return text;
}

}  // namespace

namespace {

// The manifest rank 0 kept for this save's plan, when the plan was reused.
KeptManifest* KeptForPlan(const PlannedSave& planned, const SaveOptions& options) {
  SavePlanCache* cache = options.plan_cache;
  return cache != nullptr && cache->manifest != nullptr && planned.reused && cache->manifest->plan_id == planned.plan_id
             ? cache->manifest.get()
             : nullptr;
}

}  // namespace

std::unique_ptr<ManifestAhead> StartManifestAhead(const PlannedSave& planned, const std::string& temp_dir,
                                                  const SaveOptions& options) {
  const KeptManifest* kept = KeptForPlan(planned, options);
  if (!planned.status.ok() || kept == nullptr || kept->head_room == 0) return nullptr;
  return std::make_unique<ManifestAhead>(JoinPath(temp_dir, kManifestName), kept->head_room, kept->body.text,
                                         &options.plan_cache->manifest_staging);
}

Status CommitOnRoot(const std::string& root, int64_t step, const PlannedSave& planned,
                    const std::vector<std::string>& reports_bytes, const SaveOptions& options, int64_t* total_bytes,
                    PhaseClock* clock, ManifestAhead* ahead) {
  // Before anything replaces the kept body the early write reads, or removes the temp folder.
  bool ahead_written = false;
  if (ahead != nullptr) {
    const Status early = ahead->Wait();
    ahead_written = early.ok();
    if (!ahead_written) {
      SC_LOG(kDebug) << "the early write of " << ahead->path() << " failed (" << early.ToString()
                     << "); the commit writes it whole";
    }
  }
  Result<std::vector<WriteReport>> reports = CollectReports(step, reports_bytes);
  Status committed = reports.status();
  if (committed.ok()) {
    SavePlanCache* cache = options.plan_cache;
    KeptManifest* kept = KeptForPlan(planned, options);
    if (kept != nullptr && !PlacedAlike(*reports, kept->reports)) kept = nullptr;
    Result<ManifestTextPieces> text = Internal("not encoded");
    ManifestAhead* written_ahead = nullptr;
    // For retention by a metric, or keep_last, which checks the newest checkpoints: the next
    // saves find this one remembered. No copy of the files list otherwise.
    const bool summarize = options.retention().RanksByMetric() || options.retention().keep_last > 0;
    std::optional<ManifestSummary> summary;
    if (kept != nullptr) {
      Status refreshed =
          RefreshKeptManifest(step, *planned.described, std::move(reports).value(), options, kept, total_bytes);
      if (clock != nullptr) clock->Lap("build_manifest");
      text = refreshed.ok() ? EncodeManifestWithBody(kept->head, kept->body, kept->head_room)
                            : Result<ManifestTextPieces>(refreshed);
      if (summarize) summary = SummaryOf(kept->head);
      if (text.ok() && ahead_written && ahead->Fits(text->head, text->body)) written_ahead = ahead;
      // A head that outgrew its room is written whole this time; the next save has room for it.
      if (text.ok() && text->head.size() > kept->head_room) kept->head_room = ManifestHeadRoom(text->head.size());
    } else {
      Manifest m = BuildManifest(step, *planned.described, *reports, options, total_bytes);
      if (clock != nullptr) clock->Lap("build_manifest");
      if (summarize) summary = SummaryOf(m);
      text = EncodeBuiltManifest(std::move(m), planned, std::move(reports).value(), cache, !IsMemoryBacked(root),
                                 options);
    }
    // Not to be completed: closed before the whole write opens the file anew.
    if (ahead != nullptr && written_ahead == nullptr) ahead->Close();
    committed = text.ok() ? PublishCheckpoint(root, planned.temp_name, step, {text->head, text->body, text->seal},
                                              std::move(summary), options.retention(),
                                              cache != nullptr ? &cache->manifest_staging : nullptr, written_ahead)
                          : text.status();
    if (committed.ok() && written_ahead != nullptr) ++cache->manifests_written_early;
    if (clock != nullptr) clock->Lap("commit");
    if (!committed.ok()) committed = committed.WithContext(StepFailed(step) + " on rank 0 while committing");
  }
  if (ahead != nullptr) ahead->Close();  // no open file in the folder a failure removes
  if (!committed.ok() && PathExists(JoinPath(root, planned.temp_name))) {
    RemoveCheckpointDir(root, planned.temp_name).status().IgnoreError();
  }
  return committed;
}

// ---- Report.
Status ShareOutcome(Communicator& comm, const Status& committed, int64_t* total_bytes) {
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, committed, 0));
  return comm.Broadcast(total_bytes, sizeof(*total_bytes), 0);
}

}  // namespace shardckpt::save_phases
