// Collective load with resharding (docs/architecture.md). Every rank of `comm` calls Load with the
// pieces it wants, in whatever layout it wants them: the checkpoint may have been saved by any
// number of ranks in any layout.
//
//   1. rank 0 resolves the path, reads and validates manifest.json, and broadcasts the manifest
//      (one metadata read, not N).
//   2. names are matched (after the optional rename), dtype and shape checked; ranks exchange
//      which entries they want, so strict mode can name checkpoint entries nobody loads.
//   3. each rank plans its reads (read_plan.h) and runs them (extent_reader.h), checking the size
//      of each data file it opens (missing, truncated) and verifying every block it reads.
//   4. an entry every rank wants whole (replicated, DDP-style state) is either read by one rank
//      (round-robin over such entries) and broadcast to the rest, many small entries per
//      broadcast, or read by every rank from the files directly: LoadOptions::replicated_reads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/extent_reader.h"
#include "shardckpt/engine/core/phase_times.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/engine/model/state.h"

namespace shardckpt {

// How entries every rank wants whole are loaded. kAuto: every rank reads them itself when all
// ranks run on one host and the checkpoint is memory-backed (tmpfs: every read is a copy out of
// the one page cache, and a broadcast would only add a copy through the communicator); read once
// and broadcast otherwise (across hosts, or from storage, where every rank reading with O_DIRECT
// would move the bytes from the device once per rank).
// The environment variable SHARDCKPT_REPLICATED_READS=auto|broadcast|every-rank overrides it.
enum class ReplicatedReads { kAuto, kBroadcast, kEveryRank };
// "auto", "broadcast" or "every-rank" (the environment variable, the Python package); anything
// else is an error naming the choices.
Result<ReplicatedReads> ParseReplicatedReads(const std::string& text);

// How the other ranks get the manifest rank 0 read. kRootSends: rank 0 decodes and checks it and
// sends it as a binary message (engine/model/manifest_wire.h) that they read in about a third of
// a parse's time. kEveryRankParses: rank 0 sends the text and every rank parses it, side by side
// with rank 0, which saves the message's encoding and decoding on the load's path (a fifth of the
// metadata phases of a 20,000-tensor load) but costs each rank a parse. kAuto: every rank parses
// when every host has at least as many CPUs as ranks; with fewer, the parses would take turns on
// the CPUs (16 ranks on 2 cores parsing the same text were most of a load). Rank 0's choice holds.
enum class ManifestSharing { kAuto, kRootSends, kEveryRankParses };
// "auto", "root" or "every-rank" (tools' flags); anything else is an error naming the choices.
Result<ManifestSharing> ParseManifestSharing(const std::string& text);

struct LoadOptions {
  // Strict: a wanted name missing from the checkpoint, or a checkpoint entry no rank wants, is
  // an error listing them. Not strict: both lists come back in the report.
  bool strict = true;
  // The non-tensor values the caller takes from the checkpoint's blobs (names after `rename`),
  // when it says: a strict load then also refuses, before reading anything, a value with no blob
  // of its name (nor all of its leaves, below) and a blob no value takes. The Python package
  // passes them; unset, blobs are not part of the verdict.
  std::optional<std::vector<std::string>> wanted_values;
  // By index of wanted_values, where a value may have been stored leaf by leaf (DCP flattens a
  // dict of plain values to one item per leaf): the leaf names its nesting has. The value is
  // then found whole when its own blob or every one of these is there.
  std::vector<std::vector<std::string>> wanted_value_leaves;
  // Wanted values that are empty dicts (or dicts of only those): DCP flattens them to no item at
  // all, so in a folder DCP wrote they match with nothing there, as dcp.load takes them; in our
  // own checkpoints they are one value like any other and must be there.
  std::vector<std::string> wanted_values_dcp_stores_nothing_of;
  // A rank reads its own data file whole while the manifest is decoded, shared, matched and
  // planned, where that pays (engine/core/read_ahead.h: same world size, a large manifest, a file
  // under 16x its size), if the file is no larger than this; 0: never.
  uint64_t read_ahead_max_bytes = 64u << 20;
  ManifestSharing manifest_sharing = ManifestSharing::kAuto;
  // Maps a checkpoint name to the name the job uses (e.g. strip "module."); identity when empty.
  std::function<std::string(const std::string&)> rename;
  bool verify_checksums = true;
  // false: every rank reads replicated entries itself, whatever replicated_reads says.
  bool broadcast_replicated = true;
  ReplicatedReads replicated_reads = ReplicatedReads::kAuto;
  // Broadcasts pack replicated entries smaller than this together, up to this many bytes, into
  // one collective; larger ones go alone, straight from and into their tensors.
  uint64_t broadcast_batch_bytes = 16u << 20;
  IoOptions io;
  size_t staging_buffers = 8;
  // The staging buffers stay with the process for the next load or save (staging_cache.h):
  // repeated loads neither allocate nor fault in staging memory. false: freed after this load.
  bool keep_staging = true;
  ReadPlanOptions plan;
  // Broadcasts replicated entries that every rank holds in device memory directly between
  // devices (an NcclCommunicator over the same ranks); null: through host memory and `comm`.
  Communicator* device_comm = nullptr;
};

struct BlobResult {
  bool available = false;
  std::string bytes;
  std::string reason;  // why not, when unavailable
  // A DCP folder's byte item holding a Python bytes object: `bytes` are its bytes. Its other
  // byte items come as value blobs (kPickleValueTag and typed JSON, torch_pickle.h), or, when
  // they hold more than plain values, unavailable with `bytes` the item's torch.save zip (which
  // the Python package hands to torch's weights_only unpickler).
  bool python_bytes = false;
};

struct LoadReport {
  std::string path;  // the checkpoint folder read
  int64_t step = 0;
  int saved_world_size = 0;
  std::vector<std::string> missing;     // wanted here, not in the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint, wanted by no rank
  // Global values (LoadOptions::wanted_values) this rank did not ask for that another rank
  // loads: not unexpected, as a tensor another rank loads is not.
  std::vector<std::string> values_loaded_elsewhere;
  // Entries whose parts the ranks wanted leave elements out (fewer elements together than the
  // tensor, or as many with some twice; a non-strict load, as a strict one refuses them).
  std::vector<std::string> loaded_in_part;
  std::map<std::string, BlobResult> blobs;
  uint64_t bytes_wanted = 0;  // by this rank, from storage
  ReadStats stats;            // this rank's reads
  uint64_t bytes_received = 0;  // replicated entries received from other ranks
  bool every_rank_parsed_manifest = false;  // LoadOptions::manifest_sharing, as rank 0 chose
  // This rank's time in each phase, in order: read_manifest (rank 0 reads the manifest and
  // shares the folder, the reads ahead start, and rank 0 decodes and checks it; where every rank
  // parses, the text is shared and every rank decodes it), share_manifest, match, plan, read
  // (reads, checks and copies out), replicated.
  std::vector<PhaseTime> phases;
};

Result<LoadReport> Load(Communicator& comm, const std::string& path, const ShardedState& targets,
                        const LoadOptions& options = {});

// Reads and validates a checkpoint's manifest (and its data files' sizes) without a job;
// `text`, when given, receives the file's bytes as read (also when only the data files' check
// fails). A large manifest is decoded on up to 4 of the CPUs this process may run on (its affinity
// mask, capped by a cgroup CPU quota): these are for a process reading alone (the tools, rank 0's
// retention). Load's ranks, which decode side by side, each use their share of their host's CPUs.
Result<Manifest> ReadManifest(const std::string& checkpoint_dir, std::string* text = nullptr);
// The same for one manifest.json file, its data files not looked at.
Result<Manifest> ReadManifestFile(const std::string& path, std::string* text = nullptr);
// Only the file's bytes (with O_DIRECT where it works; refused past 4 GiB).
Result<std::string> ReadManifestText(const std::string& path);
// ReadManifest's check of the data files: each of `files` is in `checkpoint_dir` at its size;
// the error names the folder and the file.
Status CheckDataFilesIn(const std::string& checkpoint_dir, const std::vector<FileRecord>& files);

// Prefix helpers for LoadOptions::rename.
std::function<std::string(const std::string&)> StripPrefix(const std::string& prefix);
std::function<std::string(const std::string&)> AddPrefix(const std::string& prefix);

}  // namespace shardckpt
