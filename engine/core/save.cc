#include "shardckpt/engine/core/save.h"

#include <algorithm>
#include <cmath>

#include "shardckpt/engine/core/save_phases.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

Status ValidateStep(int64_t step) {
  if (step >= 0) return Status::Ok();
  return InvalidArgument("step " + std::to_string(step) + " is negative; steps start at 0");
}

Result<SaveResult> Save(Communicator& comm, const std::string& root, int64_t step,
                        const ShardedState& state, const SaveOptions& options) {
  using namespace save_phases;
  const int rank = comm.rank();
  // A diverged step's loss (NaN, inf) is no metric, but its checkpoint is still wanted (to look
  // at it, or to go back from it): the value is left out, with a warning, not the save refused.
  bool finite = true;
  for (const auto& [name, value] : options.metrics) finite = finite && std::isfinite(value);
  if (!finite) {
    SaveOptions recorded = options;
    for (auto it = recorded.metrics.begin(); it != recorded.metrics.end();) {
      if (std::isfinite(it->second)) {
        ++it;
        continue;
      }
      if (rank == 0) {
        SC_LOG(kWarn) << "metric '" << it->first << "' is " << it->second << ": not recorded for step " << step
                      << " (the checkpoint is saved without it)";
      }
      it = recorded.metrics.erase(it);
    }
    return Save(comm, root, step, state, recorded);
  }
  SaveResult result;
  PhaseClock clock(&result.phases);
  // 1. Rank 0 locks the root, plans (or reuses the kept plan) and creates the temp folder; every
  //    rank gets the plan.
  SC_ASSIGN_OR_RETURN(PlannedSave planned, DecidePlan(comm, root, step, state, options));
  clock.Lap("plan");
  if (planned.lock && planned.lock->waited_s() > 0.001) {  // rank 0 waited for a prune: said as such
    const double waited = std::min(planned.lock->waited_s(), result.phases.back().seconds);
    result.phases.back().seconds -= waited;
    result.phases.insert(result.phases.end() - 1, PhaseTime{"wait_for_prune", waited});
  }
  // 2. Every rank writes its file; rank 0 of a repeat save also the kept part of the manifest.
  const std::string temp_dir = JoinPath(root, planned.temp_name);
  std::unique_ptr<ManifestAhead> ahead = rank == 0 ? StartManifestAhead(planned, temp_dir, options) : nullptr;
  WriteReport report = WriteRankFile(rank, temp_dir, state, planned, options);
  clock.Lap("write");
  result.bytes_written = static_cast<int64_t>(report.file.size);
  std::vector<std::string> reports_bytes;
  SC_RETURN_IF_ERROR(comm.Gather(EncodeWriteReport(report), &reports_bytes, 0));
  clock.Lap("gather_reports");
  // 3-9. Rank 0 commits; every rank returns its outcome.
  Status committed;
  int64_t total = 0;
  if (rank == 0) committed = CommitOnRoot(root, step, planned, reports_bytes, options, &total, &clock, ahead.get());
  SC_RETURN_IF_ERROR(ShareOutcome(comm, committed, &total));
  clock.Lap("share_outcome");
  result.path = JoinPath(root, StepDirName(step));
  if (!planned.rank0_root.empty()) {
    // This rank named another root than rank 0's and had nothing to write (else the commit would
    // have failed). Its own step folder is the checkpoint only where it is the one rank 0
    // committed, or where rank 0's path names nothing here (another host's mount of the same
    // folder); else (missing, or an older checkpoint of another root) the result is rank 0's.
    const std::string committed = JoinPath(planned.rank0_root, StepDirName(step));
    const bool own_exists = PathExists(result.path);
    if (!SameFile(result.path, committed) && (!own_exists || PathExists(committed))) {
      SC_LOG(kWarn) << "rank " << rank << ": " << result.path << (own_exists ? " is another folder" : " does not exist")
                    << ": step " << step << " was committed in rank 0's root, " << committed;
      result.path = committed;
    }
  }
  result.total_bytes = total;
  if (rank == 0 && LogEnabled(LogLevel::kInfo)) {
    double seconds = 0;
    for (const PhaseTime& p : result.phases) seconds += p.seconds;
    SC_LOG(kInfo) << "saved " << result.path << ": " << total << " bytes from " << comm.size() << " rank(s) in "
                  << seconds << " s";
  }
  return result;
}

}  // namespace shardckpt
