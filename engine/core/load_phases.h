// The phases of Load (load.h), one function each, in the order Load calls them. Internal to the
// engine: the declarations are here so each phase can be tested on its own.
//
// A phase that talks to other ranks ends with every rank agreeing on one status (or returns a
// collective's own failure, which every rank sees alike), so no rank enters the next collective
// while another has given up. The pure steps inside a phase come with it, for table tests.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/read_ahead.h"
#include "shardckpt/engine/model/entry_wants.h"
#include "shardckpt/engine/model/name_list.h"

namespace shardckpt {
class TiedTargets;
}

namespace shardckpt::load_phases {

// ---- 1. Resolve, hold, read and fully check the manifest (rank 0 only: validation and data
// file sizes; other ranks return an empty one), in two steps with the folder's sharing and the
// read ahead of each rank's own file (read_ahead.h) between them.
struct ManifestRead {
  Status status;        // rank 0's, and where every rank parses, each rank's own parse's
  std::string dir;      // the checkpoint folder
  std::string text;     // manifest.json as read, until decoded (empty for a DCP folder)
  ReadAheadHint hint;   // rank 0's, for `world` ranks; the others' once shared
  // Rank 0's LoadOptions::manifest_sharing, once shared, and what it came to (EveryRankParses):
  // every rank parses `text` itself, rather than reading rank 0's binary message.
  ManifestSharing sharing = ManifestSharing::kRootSends;
  bool every_rank_parses = false;
  // Threads each rank decodes the text on: the CPUs every rank has to itself (CpusPerRank), at
  // most 4, where the ranks' CPUs were gathered (kAuto) or the job is one process; else 1.
  size_t decode_threads = 1;
  Manifest manifest;    // rank 0's (a DCP folder's built from its .metadata); the others' once shared
  // Held until every rank has read (the status agreement after the reads): retention leaves it.
  CheckpointHold hold;
};
// Resolves and holds the folder and reads the manifest's bytes [load.read_manifest].
ManifestRead OpenManifestOnRoot(int rank, int world, const std::string& path);
// Decodes and validates them (rank 0; where every rank parses, the others decode their copy of
// the text). The data files' sizes are checked by the ranks that read them (extent_reader.h).
void DecodeManifestText(int rank, ManifestRead* read);

// ---- 2. Broadcast rank 0's status so far, the folder, the read-ahead hint and its sharing mode.
// Rank 0 resolves the checkpoint for every rank (a rank's stale view of a network filesystem must
// not decide): a rank given another `path` than rank 0 gets rank 0's, and logs a warning naming
// both (the same folder spelled otherwise, a trailing slash or a link, included).
Status ShareFolder(Communicator& comm, const std::string& path, const LoadOptions& options, ManifestRead* read);
// Decide whether every rank parses the manifest (one all-gather under kAuto) and, if so,
// broadcast its text. After ShareFolder, so that the reads ahead are under way meanwhile.
Status ShareManifestText(Communicator& comm, ManifestRead* read);
// Every rank parses the text itself: forced, or under kAuto when every host has at least as many
// CPUs as ranks: the CPUs its ranks may run on together (the union of their affinity masks),
// capped by a CPU quota. `ranks`: each rank's ThisRanksCpus() and host name, space-separated.
bool EveryRankParses(ManifestSharing mode, const std::vector<std::string>& ranks);
// The CPUs each rank has to itself on the most crowded host: its ranks' CPUs (as above) over its
// ranks, rounded down; 0 when there are fewer CPUs than ranks somewhere, or a record is unreadable.
long CpusPerRank(const std::vector<std::string>& ranks);
// Threads to decode a manifest on, given CpusPerRank: at least 1, at most 4 (past that a decode is
// held by its sequential parts).
size_t DecodeThreadsFor(long cpus_per_rank);
// "<quota CPUs, 0 for none> <affinity mask as hex digits, CPU 0 in the first digit's low bit>".
std::string ThisRanksCpus();
// The same for this process alone (the tools, a one-rank job, rank 0 reading for retention), from
// its ThisRanksCpus() (read again when not given).
size_t ThisProcessDecodeThreads(const std::string& cpus = ThisRanksCpus());
// This rank's read ahead of its own data file, where worth it; null otherwise.
std::unique_ptr<FileReadAhead> StartReadAhead(const ManifestRead& read, int rank, const LoadOptions& options);
// Broadcast rank 0's status and checked manifest, as a binary message (manifest_wire.h) that the
// other ranks read without parsing JSON; or, where every rank parsed, agree on the parses. On
// return every rank holds the same `dir` and manifest, or every rank has the same error.
Status ShareManifest(Communicator& comm, ManifestRead* read);
// The other ranks' reading of rank 0's message [load.decode_manifest].
Result<Manifest> DecodeSharedManifest(const std::string& dir, const std::string& message);

// ---- 3. Match the wanted pieces against the manifest.
// This rank's view: which entry each piece reads, the wants flags, names missing here, and the
// first dtype or shape mismatch.
struct LocalMatch {
  std::vector<long> entry_of_piece;  // by piece; -1 where the name is not in the checkpoint
  std::vector<EntryWant> wants;      // by entry
  std::vector<std::string> missing;  // wanted here, not in the checkpoint (each name once)
  Status status;                     // dtype or shape mismatches (every one counted, the first few named)
};
LocalMatch MatchPieces(const Manifest& manifest, const ShardedState& targets, const LoadOptions& options);
// A wanted name that the rename made of two saved names (entries with entries, values with
// values) is InvalidArgument naming both, in LocalMatch::status and ValueMatch::status: one was
// dropped, a tensor reported unexpected and a value lost unsaid. Names no target wants are left.
Status RenameCollision(const std::string& first, const std::string& second, std::string_view as);

// Every rank's wants combined, by entry (CombineEntryWants, with the names the phases use).
struct Demand {
  std::vector<bool> wanted_any;                  // some rank reads it
  std::vector<bool> wanted_whole_by_all;         // every rank wants it whole, none a part
  std::vector<bool> whole_on_device_everywhere;  // every rank's whole piece is on a device
  std::vector<bool> wanted_whole_by_some;        // some rank wants it whole
  bool tied_compared_anywhere = false;           // some rank compares tied targets after the load
};
Demand CombineWants(const std::vector<std::string>& all_wants, size_t entries);

// The entries that no rank wants whole and whose parts, over every rank, leave elements out
// (collective: every rank calls it with the same demand, and none calls the reduction when no
// entry is wanted only in parts). Each rank's element count and index fingerprint
// (index_fingerprint.h) of each such entry are summed over the ranks in one reduction. A count
// short of the tensor proves elements no rank loads (a rank that left the name out, a layout
// that stops short); a count equal to the tensor's whose fingerprint is not the tensor's proves
// parts that overlap and leave a gap (two ranks loading the same shard; missed only by a chance
// of about 2^-40). A count of k times the tensor's with k times its fingerprint is k copies of
// each element (replicas, as in HSDP). Any other count above the tensor's (replicas not each
// loaded equally, or a wrong shard of an uneven split) is decided exactly: the ranks' layouts of
// those entries alone are gathered (a second collective, which correct loads never make) and
// their union checked (kUncovered where an element is missing; kUndecided, for a warning only,
// where that would take more than a million runs). Short and overlapping entries in manifest
// order, then uncovered and undecided ones; a strict load refuses all but kUndecided.
struct PartlyLoaded {
  enum Kind { kShort, kOverlapping, kUncovered, kUndecided };
  std::string name;
  int64_t loaded = 0, elements = 0;
  Kind kind = kShort;
};
Result<std::vector<PartlyLoaded>> EntriesLoadedInPart(Communicator& comm, const Manifest& manifest,
                                                      const ShardedState& targets, const LocalMatch& local,
                                                      const Demand& demand);

// Checkpoint entries no rank wants.
std::vector<std::string> UnwantedEntries(const Manifest& manifest, const Demand& demand);

// The values side of a match (LoadOptions::wanted_values against the manifest's blobs, renamed):
// wanted values with no blob of their name nor any of their leaves (or the leaves absent where
// only some are there), and blobs no wanted value takes.
struct ValueMatch {
  std::vector<std::string> missing, unexpected;
  // Of `unexpected`, this rank's own per-rank values (at the saved world size): this rank saved
  // one, and its state left the name out. Named as such, not as "no rank loads".
  std::vector<std::string> own_unloaded;
  Status status;  // a wanted value the rename made of two saved values
  // Of `missing`, those the checkpoint holds as tensors (after the rename): said as a tensor
  // passed as a value even where another rank's state takes the tensor.
  std::vector<std::string> tensors_named;
  std::vector<std::string> tensors_named_saved;  // the same tensors under their saved names
  // Of `unexpected`, global values another rank loads (set by MatchEntries after the wants are
  // gathered): not "no rank loads" them; still in `unexpected` for the verdict's other causes
  // (a value passed as a tensor here).
  std::vector<std::string> loaded_elsewhere;
};
// At the saved world size a rank takes only its own per-rank blobs (as PlanReads gives them):
// `rank` is this rank there, -1 at another world size (every rank's records count).
ValueMatch MatchValues(const Manifest& manifest, const std::vector<std::string>& wanted_values, const LoadOptions& options,
                       int rank = -1);

// The local match's error, else (strict only) the missing or unexpected names, tensors and
// values, as one error; NotFound when anything is missing. A wanted value with checkpoint
// entries under its name (an optimizer's state_dict() before its first step holds no state
// tensors) gets a hint to create that state rather than to load non-strictly.
Status MatchVerdict(const Status& local, bool strict, const std::string& dir, const std::vector<std::string>& missing,
                    const std::vector<std::string>& unexpected, const ValueMatch& values = {},
                    const std::vector<std::string>& wanted_values = {});

// Entries everyone wants whole: one reader each (round-robin), then a broadcast; -1 elsewhere.
std::vector<int> AssignReaders(const Demand& demand, bool broadcast_replicated, int world);

// Read once and broadcast (true) or every rank reads (false), from the option, the environment's
// SHARDCKPT_REPLICATED_READS (null when unset), whether the job runs on one host and whether the
// checkpoint is memory-backed (tmpfs): auto reads on every rank only on one host from memory,
// where every rank's read is a copy out of the one page cache. From storage (O_DIRECT) every rank
// reading would move the bytes from the device once per rank; read once and broadcast moves
// them once. A bad environment value is an error naming it.
Result<bool> ChooseBroadcast(bool broadcast_replicated, ReplicatedReads mode, const char* env, bool one_host,
                             bool memory_backed);
// The same, agreed on by every rank: one allgather of each rank's host, choices and storage;
// ranks that chose differently (their environments differ) fail alike, naming the ranks.
struct ReplicatedReadChoice {
  bool broadcast = false;
  // Every rank runs on one host, sees the folder memory-backed and verifies checksums: the
  // bytes every rank reads are copies of the same pages, each verified once (SharedBlocks).
  bool same_pages = false;
};
Result<ReplicatedReadChoice> AgreeOnBroadcast(Communicator& comm, const LoadOptions& options, const std::string& dir);

// Replicated entries of one reader sent in one broadcast: small entries are packed together up
// to `batch_bytes`; an entry of `batch_bytes` or more, or one marked `alone` (device to device),
// goes by itself, straight from and into its tensor's memory. In the same order on every rank.
struct BroadcastBatch {
  int reader = 0;
  std::vector<size_t> entries;
  uint64_t bytes = 0;
  bool packed = false;
};
std::vector<BroadcastBatch> BatchBroadcasts(const std::vector<int>& reader_of, const std::vector<uint64_t>& entry_bytes,
                                            const std::vector<bool>& alone, int world, uint64_t batch_bytes);

struct Match {
  LocalMatch local;
  Demand demand;
  std::vector<int> reader_of;  // by entry
  bool same_pages = false;     // ReplicatedReadChoice::same_pages
};

// The blocks every rank reads (entries every rank wants whole and reads itself, and the global
// blobs), when every rank reads them from the same pages and there is more than one rank; else
// none. Each is then verified by one rank only (SharedBlocks).
SharedBlocks BlocksEveryRankReads(const Manifest& manifest, const Match& match, int rank, int world);
// Phase 3 as a whole: matches, exchanges wants (fills report->missing and ->unexpected), agrees
// on the verdict, assigns readers and agrees every device piece has a usable device.
// `tied`, where given: the targets' shared memory (its refusal joins the verdict; the pieces it
// compares are said in the wants, Demand::tied_compared_anywhere).
Result<Match> MatchEntries(Communicator& comm, const Manifest& manifest, const std::string& dir,
                           const ShardedState& targets, const LoadOptions& options, LoadReport* report,
                           const TiedTargets* tied = nullptr);

// The first device piece whose device this process cannot use, as an error.
Status CheckDevices(const ShardedState& targets);

// ---- 4. Plan this rank's reads: its pieces (not those another rank reads for broadcast), every
// global blob, and its own per-rank blobs when the world size is unchanged. Blob buffers live in
// report->blobs, which the read fills. `verified_from_memory`: the folder is memory-backed and the
// load verifies checksums; then, when this rank reads into host memory only, its extents are cut
// at plan_options.memory_backed_max_extent (PlanOptionsFor), to be verified while in cache.
struct ReadWork {
  ReadTargets targets;
  // The blobs' labels in targets.names ("blob <name>"): a deque, so that a view of one stays
  // valid as more are added and when the work is moved.
  std::deque<std::string> labels;
  bool any_device_target = false;
  ReadPlan plan;
  uint64_t max_extent = 0;  // the max_extent the plan was cut at, which sizes its staging
  SharedBlocks shared;

  ReadWork() = default;
  // A copy's names would view the original's labels: moves only.
  ReadWork(const ReadWork&) = delete;
  ReadWork& operator=(const ReadWork&) = delete;
  ReadWork(ReadWork&&) = default;
  ReadWork& operator=(ReadWork&&) = default;
};
ReadWork PlanReads(const Manifest& manifest, const ShardedState& targets, const Match& match, int rank, int world,
                   const ReadPlanOptions& plan_options, bool verified_from_memory, LoadReport* report);

// Staging buffers for a plan: a few large buffers for large extents, many small ones (so many
// reads in flight) when resharding cuts the reads into row segments.
struct StagingSize {
  size_t buffers = 0;
  uint64_t buffer_bytes = 0;
};
StagingSize SizeStaging(const ReadPlan& plan, size_t staging_buffers, uint64_t max_extent);

// ---- 5. Read and verify the planned extents (local; Load agrees on the status); the extents in
// the file `ahead` read (if any, and if its read succeeded) come from its memory.
Status ReadExtents(const std::string& dir, const Manifest& manifest, const ReadWork& work,
                   const LoadOptions& options, ReadStats* stats, FileReadAhead* ahead = nullptr);

// ---- 6. Replicated entries: each reader broadcasts (BatchBroadcasts: small entries packed,
// many per collective); extra whole copies on one rank are local copies [load.replicate]. Ends
// with the agreement.
Status ShareReplicated(Communicator& comm, const Manifest& manifest, const ShardedState& targets,
                       const Match& match, const LoadOptions& options, LoadReport* report);

// Copies one whole piece into another of the same entry, whichever memory each lives in.
Status CopyPiece(const TensorPiece& to, const TensorPiece& from);

}  // namespace shardckpt::load_phases
