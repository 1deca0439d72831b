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
#include "shardckpt/engine/core/manifest_ahead.h"
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

// What rank 0 decides and every rank then shares. The plan and descriptions are shared, so a
// SavePlanCache keeps them without copying a million pieces.
struct PlannedSave {
  Status status;                    // rank 0's planning, with the "failed on rank 0" context
  std::unique_ptr<RootLock> lock;   // rank 0 only, held until Save returns
  std::shared_ptr<const Descriptions> described;  // rank 0 only
  std::shared_ptr<const SavePlan> plan;
  int64_t plan_id = 0;              // rank 0's random id for the plan (SavePlanCache)
  bool reused = false;              // the plan came from the SavePlanCache
  std::string temp_name;            // <root>/<temp_name> receives the data files
  std::string plan_bytes;           // the broadcast: temp_name, plan id and the encoded plan
  Status decoded;                   // a rank's own failure to decode plan_bytes [save.decode_plan]
  // Rank 0's root (absolute), on a rank that named another one: a rank with nothing to write
  // there does not fail the commit, and returns the folder rank 0 committed.
  std::string rank0_root;
};
// On rank 0: validates the step, retention rule and metrics, takes the root lock, cleans the
// root, plans and creates the temp folder. Elsewhere: an empty plan, status Ok.
PlannedSave PlanOnRoot(int rank, const std::string& root, int64_t step, const std::vector<std::string>& gathered,
                       const SaveOptions& options);

// ---- Reuse (a repeat save with a SavePlanCache, save_plan_cache.h).
// This rank's description digest, its host included (the manifest counts hosts), and the
// packing option: packing is applied when the file is written, not planned, but a kept plan is
// only reused for saves that ask for the same file layout, so a change of option replans.
uint64_t DescriptionDigest(const std::string& host, const ShardedState& state, bool pack_small_chunks = true);
// One allreduce, on every save (with or without a cache, so ranks that differ in that still
// meet in the same collectives): true on every rank when every rank's cache holds the same plan,
// made from the description it has now, for this world, and every rank saves the same step.
// The same allreduce carries `values_digest` (GlobalValuesDigest): `values_differ`, where given,
// is set on every rank when the ranks' digests are not all equal; and whether this rank's state
// refused an addition (ShardedState::refusal): `any_refused`, where given, is set on every rank
// when some rank's did.
Result<bool> AgreeOnReuse(Communicator& comm, int64_t step, uint64_t digest, const SavePlanCache* cache,
                          uint64_t values_digest = 0, bool* values_differ = nullptr, bool refused = false,
                          bool* any_refused = nullptr);

// A global value (blob) is stored once, from the lowest rank holding it: a value that differs
// between ranks (an RNG state, a per-rank data position saved as global) would come back as that
// rank's on every rank, and a resume would quietly differ. Order-independent digest of a rank's
// global values (names and bytes), compared in the reuse vote at no extra collective.
uint64_t GlobalValuesDigest(const ShardedState& state);
// This rank's global values as (name, digest of its bytes), encoded for an allgather.
std::string EncodeGlobalValues(const ShardedState& state);
// Pure: over every rank's EncodeGlobalValues, the first value that ranks holding it hold with
// different bytes, as an InvalidArgument naming it and which ranks hold what; OK when only the
// set of values differs (a value some ranks lack is not a conflict).
Status GlobalValueConflicts(const std::vector<std::string>& gathered);
// The options a save applies once, from rank 0 (retention rule, metric names, user metadata), as
// text: compared across ranks with the global values, at no extra collective when they agree.
std::string AgreedOptionsText(const SaveOptions& options);
// Pure: InvalidArgument naming the ranks and their options when the ranks' AgreedOptionsText
// differ, or a metric's values differ by more than reductions do (a relative 1e-9: an
// all-reduced loss may differ in its last bits between ranks; a rank's own loss is refused).
Status OptionConflicts(const std::vector<std::string>& texts, const std::vector<std::map<std::string, double>>& metrics);
// PlanOnRoot with the cached plan and descriptions (every rank agreed to reuse them): the same
// checks, lock, cleanup and temp folder, no planning; the broadcast carries no plan.
PlannedSave PlanOnRootFromCache(int rank, const std::string& root, int64_t step, const SaveOptions& options,
                                const SavePlanCache& cache);
// After SharePlan: keeps a fresh plan (or counts a reuse). A rank that could not decode the plan
// drops its cache, so the next save plans afresh everywhere.
void KeepPlan(SavePlanCache* cache, const PlannedSave& planned, uint64_t digest, int world);

// ---- Broadcast the plan. Returns rank 0's status (or the collective's); the other ranks decode
// the plan (or take it from `cache` when rank 0 reused it), keeping a failure in
// planned->decoded.
Status SharePlan(Communicator& comm, PlannedSave* planned, const SavePlanCache* cache = nullptr);
// `plan` null: the receivers use their cached plan of id `plan_id`.
std::string EncodePlanMessage(const std::string& temp_name, int64_t plan_id, const SavePlan* plan);
// `*plan` is left null when the message carries none (a reused plan).
Status DecodePlanMessage(const std::string& bytes, int world, std::string* temp_name, int64_t* plan_id,
                         std::shared_ptr<const SavePlan>* plan);

// ---- Step 1 whole, as Save runs it: the reuse vote, then either the gather and planning or the
// kept plan, then the broadcast; the plan is kept in options.plan_cache. Returns the
// collectives' or rank 0's failure; a rank's own decoding failure is in `decoded`.
Result<PlannedSave> DecidePlan(Communicator& comm, const std::string& root, int64_t step, const ShardedState& state,
                               const SaveOptions& options);

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

// Rank 0's record of the manifest its kept plan last committed (SavePlanCache::manifest). A
// repeat save of that plan whose reports place every piece and blob where those did, in files of
// the same sizes, commits the same entries and blobs: only the step, creation, metrics and the
// files' checksum tables are new. It refreshes those and reuses the rest, validated and encoded:
// at 20,000 tensors the build, validation and encoding were a third of a save.
struct KeptManifest {
  int64_t plan_id = 0;
  std::vector<WriteReport> reports;  // those the manifest was built from
  Manifest head;                     // the validated manifest without its entries and blobs
  ManifestBody body;                 // its entries and blobs, encoded
  uint64_t head_room = 0;            // where a repeat save's body starts (ManifestHeadRoom)
  // The state paths (SaveOptions::state_paths) its manifest recorded, "" when it recorded none
  // of them: a repeat save records its own only when they are these (the check that they place
  // every leaf needs the names, which a kept manifest holds only as text).
  std::string recorded_state_paths;
};
// Whether `now` places every piece and blob where `before` did, in files of the same name,
// size, table offset and number of table checksums.
bool PlacedAlike(const std::vector<WriteReport>& now, const std::vector<WriteReport>& before);

// Writes this rank's assigned pieces and blobs to <temp_dir>/rank-RRRRR.bin; a plan this rank
// could not decode is its report's status.
WriteReport WriteRankFile(int rank, const std::string& temp_dir, const ShardedState& state,
                          const PlannedSave& planned, const SaveOptions& options);

// On rank 0 of a save that reuses its kept plan and has that plan's manifest: starts writing the
// kept body into the temp folder's manifest while the ranks write their data files
// (manifest_ahead.h). Null otherwise.
std::unique_ptr<ManifestAhead> StartManifestAhead(const PlannedSave& planned, const std::string& temp_dir,
                                                  const SaveOptions& options);

// ---- Commit (steps 3-9, on rank 0).
// Decodes every rank's report; any rank's failure is one error naming the failing ranks.
Result<std::vector<WriteReport>> CollectReports(int64_t step, const std::vector<std::string>& reports_bytes);
// The manifest the reports describe; `*total_bytes` receives the sum of the files' sizes.
Manifest BuildManifest(int64_t step, const Descriptions& described, const std::vector<WriteReport>& reports,
                       const SaveOptions& options, int64_t* total_bytes);
// Collects, builds and commits (with retention); on failure removes the temp folder.
Status CommitOnRoot(const std::string& root, int64_t step, const PlannedSave& planned,
                    const std::vector<std::string>& reports_bytes, const SaveOptions& options, int64_t* total_bytes,
                    PhaseClock* clock = nullptr, ManifestAhead* ahead = nullptr);

// ---- Report: rank 0's commit status and the total bytes, to every rank.
Status ShareOutcome(Communicator& comm, const Status& committed, int64_t* total_bytes);

}  // namespace shardckpt::save_phases
