// The phases of Save (save.h), one function each, in the order Save calls them. Internal to the
// engine: the declarations are here so each phase can be tested on its own. The step numbers in
// comments are those of the commit protocol in save.h.
//
// A phase that talks to other ranks returns only what every rank sees alike (a collective's
// failure, or rank 0's broadcast status), so no rank enters the next collective alone. A rank's
// own failure while decoding the plan or writing travels in its write report instead.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/save_plan.h"

namespace shardckpt::save_phases {

// ---- Describe: what each rank sends rank 0 (the step, its host, its pieces and blobs).
std::string DescribeRank(int64_t step, const std::string& host, const ShardedState& state);
std::string HostName();

// ---- Plan (step 1, on rank 0).
// Every rank saves the same step, and no step is negative (its folder would never be listed,
// loaded or cleaned).
Status CheckSteps(int64_t step, const std::vector<std::string>& gathered);

struct Descriptions {
  std::vector<RankDescription> ranks;  // by rank
  std::set<std::string> hosts;
};
Result<Descriptions> DecodeDescriptions(const std::vector<std::string>& gathered);

// What rank 0 decides and every rank then shares.
struct PlannedSave {
  Status status;                    // rank 0's planning, with the "failed on rank 0" context
  std::unique_ptr<RootLock> lock;   // rank 0 only, held until Save returns
  Descriptions described;           // rank 0 only
  SavePlan plan;
  std::string temp_name;            // <root>/<temp_name> receives the data files
  std::string plan_bytes;           // the broadcast: temp_name and the encoded plan
  Status decoded;                   // a rank's own failure to decode plan_bytes [save.decode_plan]
};
// On rank 0: validates the step, retention rule and metrics, takes the root lock, cleans the
// root, plans and creates the temp folder. Elsewhere: an empty plan, status Ok.
PlannedSave PlanOnRoot(int rank, const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                       const SaveOptions& options);

// ---- Broadcast the plan. Returns rank 0's status (or the collective's); the other ranks decode
// the plan, keeping a failure in planned->decoded.
Status SharePlan(Communicator& comm, PlannedSave* planned);
std::string EncodePlanMessage(const std::string& temp_name, const SavePlan& plan);
Status DecodePlanMessage(const std::string& bytes, int world, std::string* temp_name, SavePlan* plan);

// ---- Write (step 2, every rank).
// What a rank reports after writing: its status, its file and where each assigned item landed.
struct WriteReport {
  Status status;
  bool wrote_file = false;
  FileRecord file;
  std::vector<std::pair<uint64_t, uint64_t>> piece_offsets;  // (piece index, offset)
  std::vector<std::pair<uint64_t, uint64_t>> blob_offsets;
};
std::string EncodeWriteReport(const WriteReport& report);
Result<WriteReport> DecodeWriteReport(const std::string& bytes);

// Writes this rank's assigned pieces and blobs to <temp_dir>/rank-RRRRR.bin; a plan this rank
// could not decode is its report's status.
WriteReport WriteRankFile(int rank, const std::string& temp_dir, const ShardedState& state,
                          const PlannedSave& planned, const SaveOptions& options);

// ---- Commit (steps 3-9, on rank 0).
// Decodes every rank's report; any rank's failure is one error naming the failing ranks.
Result<std::vector<WriteReport>> CollectReports(int64_t step, const std::vector<std::string>& reports_bytes);
// The manifest the reports describe; `*total_bytes` receives the sum of the files' sizes.
Manifest BuildManifest(int64_t step, const Descriptions& described, const std::vector<WriteReport>& reports,
                       const SaveOptions& options, int64_t* total_bytes);
// Collects, builds and commits (with retention); on failure removes the temp folder.
Status CommitOnRoot(const std::string& root, int64_t step, const PlannedSave& planned,
                    const std::vector<std::string>& reports_bytes, const SaveOptions& options, int64_t* total_bytes);

// ---- Report: rank 0's commit status and the total bytes, to every rank.
Status ShareOutcome(Communicator& comm, const Status& committed, int64_t* total_bytes);

}  // namespace shardckpt::save_phases
