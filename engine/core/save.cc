#include "shardckpt/engine/core/save.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <random>
#include <set>
#include <unordered_map>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/model/save_plan.h"
#include "shardckpt/engine/core/shard_writer.h"
#include "shardckpt/engine/model/wire.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {


std::string HostName() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// What a rank reports after writing: its status, its file and where each assigned item landed.
struct WriteReport {
  Status status;
  bool wrote_file = false;
  FileRecord file;
  std::vector<std::pair<uint64_t, uint64_t>> piece_offsets;  // (piece index, offset)
  std::vector<std::pair<uint64_t, uint64_t>> blob_offsets;
};

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

// Before rank 0 touches the root: every rank saves the same step, and no step is negative (its
// folder would never be listed, loaded or cleaned).
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

// Step 1, on rank 0: lock, clean up, plan, create the temp folder.
Status Prepare(const std::string& root, int64_t step, const std::vector<std::string>& gathered,
               std::vector<RankDescription>* ranks, std::set<std::string>* hosts, SavePlan* plan,
               std::string* temp_name) {
  SC_RETURN_IF_ERROR(MakeDirs(root));
  SC_RETURN_IF_ERROR(PrepareRoot(root, step));
  for (size_t r = 0; r < gathered.size(); ++r) {
    WireReader reader(gathered[r]);
    reader.U64();  // the step, checked by CheckSteps
    hosts->insert(reader.Str());
    std::string description = reader.Str();
    if (!reader.ok()) return Internal("truncated description from rank " + std::to_string(r));
    Result<RankDescription> d = DecodeRankDescription(description);
    if (!d.ok()) return d.status().WithContext("rank " + std::to_string(r));
    ranks->push_back(std::move(d).value());
  }
  SC_ASSIGN_OR_RETURN(*plan, PlanSave(*ranks));
  *temp_name = TempDirName(step, RandomId());
  return MakeDir(JoinPath(root, *temp_name));
}

// Step 2, on every rank.
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
    std::unique_ptr<BufferPool> own_pool;
    BufferPool* pool = options.staging;
    if (pool == nullptr) {
      SC_ASSIGN_OR_RETURN(own_pool, BufferPool::Create(options.staging_buffers, options.staging_buffer_bytes,
                                                       StagingHostAllocator(from_device)));
      pool = own_pool.get();
    }
    IoOptions io_options = options.io;
    io_options.queue_depth = std::max<size_t>(io_options.queue_depth, pool->count() + 1);
    std::unique_ptr<IoEngine> io = CreateIoEngine(io_options);
    ShardFileWriter writer(io.get(), pool, options.always_stage, options.pieces_padded);
    SC_RETURN_IF_ERROR(writer.Open(temp_dir, RankFileName(rank)));
    std::vector<DeviceCopier*> settled;  // devices whose queued work has finished
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!pieces[i]) continue;
      const TensorPiece& p = state.pieces()[i];
      auto append = [&]() -> Result<uint64_t> {
        if (p.space == MemorySpace::kHost) return writer.Append(p.data, static_cast<size_t>(p.bytes));
        SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(p.device));
        if (std::find(settled.begin(), settled.end(), copier) == settled.end()) {
          SC_RETURN_IF_ERROR(copier->WaitForDeviceWork());
          settled.push_back(copier);
        }
        return writer.AppendFromDevice(p.data, static_cast<size_t>(p.bytes), copier);
      };
      Result<uint64_t> offset = append();
      if (!offset.ok()) return offset.status().WithContext("tensor '" + p.name + "'");
      report.piece_offsets.emplace_back(i, *offset);
    }
    for (size_t j = 0; j < blobs.size(); ++j) {
      if (!blobs[j]) continue;
      const BlobItem& b = state.blobs()[j];
      SC_ASSIGN_OR_RETURN(uint64_t offset, writer.Append(b.bytes.data(), b.bytes.size()));
      report.blob_offsets.emplace_back(j, offset);
    }
    SC_ASSIGN_OR_RETURN(report.file, writer.Finish());
    report.wrote_file = true;
    return Status::Ok();
  };
  report.status = run();
  return report;
}

// Steps 3-8, on rank 0.
Status Commit(const std::string& root, int64_t step, const std::string& temp_name, int world,
              const std::vector<RankDescription>& ranks, const std::vector<WriteReport>& reports,
              const std::set<std::string>& hosts, const SaveOptions& options, int64_t* total_bytes) {
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.created = MakeCreationInfo(static_cast<int>(hosts.size()), options.torch_version, options.git_commit,
                               options.user_metadata);
  m.metrics = options.metrics;
  std::unordered_map<std::string, size_t> entry_index;
  for (int r = 0; r < world; ++r) {
    const WriteReport& report = reports[r];
    if (!report.wrote_file) continue;
    uint32_t file = static_cast<uint32_t>(m.files.size());
    m.files.push_back(report.file);
    *total_bytes += static_cast<int64_t>(report.file.size);
    for (auto [index, offset] : report.piece_offsets) {
      const PieceDescription& p = ranks[r].pieces[index];
      auto [it, fresh] = entry_index.try_emplace(p.name, m.entries.size());
      if (fresh) m.entries.push_back(EntryRecord{p.name, p.dtype, p.shape, {}});
      if (p.bytes == 0) continue;  // empty pieces (uneven splits) need no chunk
      m.entries[it->second].chunks.push_back(
          ChunkRecord{file, offset, static_cast<uint64_t>(p.bytes), Normalize(p.layout, p.shape)});
    }
    for (auto [index, offset] : report.blob_offsets) {
      const BlobDescription& b = ranks[r].blobs[index];
      m.blobs.push_back(BlobRecord{b.name, b.scope, r, file, offset, static_cast<uint64_t>(b.bytes)});
    }
  }
  // Entries ordered by name, so manifests of equal states compare equal.
  std::sort(m.entries.begin(), m.entries.end(),
            [](const EntryRecord& a, const EntryRecord& b) { return a.name < b.name; });
  return CommitCheckpoint(root, temp_name, m, options.retention());
}

}  // namespace

Status ValidateStep(int64_t step) {
  if (step >= 0) return Status::Ok();
  return InvalidArgument("step " + std::to_string(step) + " is negative; steps start at 0");
}

Result<SaveResult> Save(Communicator& comm, const std::string& root, int64_t step,
                        const ShardedState& state, const SaveOptions& options) {
  const int rank = comm.rank();
  const int world = comm.size();
  WireWriter mine;
  mine.U64(static_cast<uint64_t>(step));
  mine.Str(HostName());
  mine.Str(EncodeRankDescription(DescribeState(state)));
  std::vector<std::string> gathered;
  SC_RETURN_IF_ERROR(comm.Gather(mine.bytes(), &gathered, 0));

  std::unique_ptr<RootLock> lock;
  std::vector<RankDescription> ranks;
  std::set<std::string> hosts;
  SavePlan plan;
  std::string temp_name;
  std::string plan_bytes;
  Status prepared;
  if (rank == 0) {
    // Rank 0 applies retention and records the metrics: a rule or metric it cannot use is
    // refused now, not after every rank has written (a save would commit, then warn).
    prepared = CheckSteps(step, gathered);
    if (prepared.ok()) prepared = ValidatePolicy(options.retention());
    if (prepared.ok()) prepared = ValidateMetrics(options.metrics);
    if (prepared.ok()) prepared = MakeDirs(root);
    if (prepared.ok()) {
      Result<RootLock> acquired = RootLock::Acquire(root);
      if (acquired.ok()) {
        lock = std::make_unique<RootLock>(std::move(acquired).value());
        prepared = Prepare(root, step, gathered, &ranks, &hosts, &plan, &temp_name);
      } else {
        prepared = acquired.status();
      }
    }
    if (prepared.ok()) {
      WireWriter w;
      w.Str(temp_name);
      w.Str(EncodeSavePlan(plan));
      plan_bytes = std::move(w.bytes());
    }
  }
  if (!prepared.ok()) prepared = prepared.WithContext("save of step " + std::to_string(step) + " failed on rank 0");
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, prepared, 0));
  SC_RETURN_IF_ERROR(BroadcastString(comm, &plan_bytes, 0));
  // A rank that cannot read the plan still joins the report gather, with its error as report.
  Status decoded = Status::Ok();
  if (rank != 0) {
    WireReader reader(plan_bytes);
    temp_name = reader.Str();
    std::string encoded = reader.Str();
    decoded = Failpoint("save.decode_plan", "save plan from rank 0");
    if (decoded.ok() && !reader.ok()) decoded = Internal("truncated save plan from rank 0");
    if (decoded.ok()) {
      Result<SavePlan> decoded_plan = DecodeSavePlan(encoded, world);
      decoded = decoded_plan.status();
      if (decoded.ok()) plan = std::move(decoded_plan).value();
    }
  }

  const std::string temp_dir = JoinPath(root, temp_name);
  WriteReport report;
  if (decoded.ok()) report = WriteShard(rank, temp_dir, state, plan, options);
  else report.status = decoded;
  SaveResult result;
  result.bytes_written = static_cast<int64_t>(report.file.size);
  if (!report.status.ok() && decoded.ok()) {
    report.status = report.status.WithContext("writing " + JoinPath(temp_dir, RankFileName(rank)));
  }
  std::vector<std::string> reports_bytes;
  SC_RETURN_IF_ERROR(comm.Gather(EncodeWriteReport(report), &reports_bytes, 0));

  Status committed;
  int64_t total = 0;
  if (rank == 0) {
    std::vector<WriteReport> reports;
    std::string failures;
    Code first_code = Code::kOk;
    for (int r = 0; r < world && committed.ok(); ++r) {
      Result<WriteReport> decoded = DecodeWriteReport(reports_bytes[r]);
      if (!decoded.ok()) committed = decoded.status().WithContext("rank " + std::to_string(r));
      else reports.push_back(std::move(decoded).value());
      if (committed.ok() && !reports.back().status.ok()) {
        if (first_code == Code::kOk) first_code = reports.back().status.code();
        failures += (failures.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + reports.back().status.ToString());
      }
    }
    if (committed.ok() && !failures.empty()) committed = Status(first_code, "save of step " + std::to_string(step) + " failed: " + failures);
    if (committed.ok()) {
      committed = Commit(root, step, temp_name, world, ranks, reports, hosts, options, &total);
      if (!committed.ok()) {
        committed = committed.WithContext("save of step " + std::to_string(step) + " failed on rank 0 while committing");
      }
    }
    if (!committed.ok() && PathExists(temp_dir)) RemoveCheckpointDir(root, temp_name).status().IgnoreError();
  }
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, committed, 0));
  SC_RETURN_IF_ERROR(comm.Broadcast(&total, sizeof(total), 0));
  result.path = JoinPath(root, StepDirName(step));
  result.total_bytes = total;
  return result;
}

}  // namespace shardckpt
