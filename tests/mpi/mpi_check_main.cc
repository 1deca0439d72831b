// shardckpt_mpi_check: the multi-rank test driver, run under mpirun by the CTest cases in
// tests/mpi/*.sh. Every mode checks bytes or error messages and exits non-zero when they are
// not what they must be.
//
//   save    ROOT --step S --family F         save the scenario
//   load    ROOT --family F --expect-step S  load (resharded when the world or family differs)
//   roundtrip ROOT --family F                save then load at the same world size
//   save-fails ROOT --step S --expect TEXT.. a save that must fail on every rank with TEXT
//   save-loop ROOT --step S --count N --keep-last K   saves steps S..S+N-1 with retention
//   load-loop ROOT --count N                  loads the root N times; every load must succeed
//   plan-cache ROOT --step S                 repeat saves with a SavePlanCache: reuse while no
//                                            rank's layout changes, a fresh plan on every rank
//                                            when one rank's does
//   outcome ROOT --op save|load|async --step S  run one operation (failpoints from the
//                                            environment), print each rank's Status, then clear
//                                            the failpoints and load ROOT, printing its step
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/io_engine.h"
#include "tests/mpi/scenario.h"
#include "tests/test_util.h"

using namespace shardckpt;
using namespace shardckpt::testing;

namespace {

struct Args {
  std::string mode, root, family = "mixed";
  int64_t step = 1;
  int64_t expect_step = -1;
  size_t staging_bytes = 8u << 20;
  std::vector<std::string> expect;
  int64_t count = 1;          // save-loop, load-loop
  int keep_last = 0;
  int victim = -1;            // dead-rank: the rank that never reaches the save
  std::string victim_does;    // exit | hang | broadcast (a collective other than the save's first)
  std::string op;             // outcome: save | load | async
  bool tiny = false;          // only the small entries: campaigns run hundreds of jobs
  std::string replicated_reads = "auto";  // load: auto | broadcast | every-rank
  uint64_t broadcast_batch = 16u << 20;   // load: LoadOptions::broadcast_batch_bytes
  bool deferred = false;                  // async: StartSave + Fence (copy while training)
  bool then_succeeds = false;             // async: after the expected failure, the next save works
  bool no_rank_blobs = false; // load: a checkpoint written by `shardckpt reshard` (its per-rank blobs left out)
  // load: 1, every rank reads its own file ahead (where io_uring and O_DIRECT work); 0, none does.
  int expect_read_ahead = -1;
  std::string manifest_sharing = "auto";  // load: auto | root | every-rank
  int unverified_rank = -1;  // load: this rank loads with verify_checksums off
};

struct Held {
  std::vector<std::vector<uint8_t>> buffers;
  ShardedState state;
};

// Builds this rank's pieces; `fill` writes the expected bytes (for saving) or a poison pattern.
Held Build(const std::string& family, int world, int rank, int64_t step, bool fill, bool tiny = false) {
  Held held;
  std::vector<ScenarioEntry> entries;
  for (const ScenarioEntry& e : ScenarioEntries()) {
    if (!tiny || NumElements(e.shape).value() <= 4096) entries.push_back(e);
  }
  for (const ScenarioEntry& e : entries) {
    for (const Layout& layout : ScenarioLayouts(e, family, world, rank)) {
      std::vector<uint8_t> bytes = PieceBytes(e.name, e.dtype, e.shape, layout);
      if (!fill) std::fill(bytes.begin(), bytes.end(), 0xCD);
      held.buffers.push_back(std::move(bytes));
    }
  }
  size_t k = 0;
  for (const ScenarioEntry& e : entries) {
    for (const Layout& layout : ScenarioLayouts(e, family, world, rank)) {
      Status s = held.state.AddTensor(e.name, e.dtype, e.shape, layout, held.buffers[k++].data());
      if (!s.ok()) std::fprintf(stderr, "AddTensor: %s\n", s.ToString().c_str());
    }
  }
  held.state.AddBlob("step", std::to_string(step)).IgnoreError();
  held.state.AddBlob("config", "{\"scenario\": 1}").IgnoreError();
  held.state.AddBlob("rng", "rng-" + std::to_string(rank) + "-of-" + std::to_string(world), BlobScope::kPerRank).IgnoreError();
  return held;
}

int Fail(int rank, const std::string& what) {
  std::printf("rank %d: FAIL %s\n", rank, what.c_str());
  std::fflush(stdout);
  return 1;
}

int DoSave(Communicator& comm, const Args& a) {
  Held held = Build(a.family, comm.size(), comm.rank(), a.step, true);
  SaveOptions options;
  options.staging_buffer_bytes = a.staging_bytes;
  options.user_metadata["test"] = "mpi_check";
  Result<SaveResult> saved = Save(comm, a.root, a.step, held.state, options);
  if (!saved.ok()) return Fail(comm.rank(), "save: " + saved.status().ToString());
  std::printf("rank %d/%d: saved step %lld (%lld bytes by this rank, %lld in all)\n", comm.rank(), comm.size(),
              static_cast<long long>(a.step), static_cast<long long>(saved->bytes_written),
              static_cast<long long>(saved->total_bytes));
  return 0;
}

int CheckExpected(Communicator& comm, const Args& a, const std::string& message);

int DoLoad(Communicator& comm, const Args& a) {
  const int rank = comm.rank(), world = comm.size();
  Held held = Build(a.family, world, rank, 0, false);
  LoadOptions options;
  const Result<ReplicatedReads> replicated = ParseReplicatedReads(a.replicated_reads);
  if (!replicated.ok()) return Fail(rank, replicated.status().ToString());
  options.replicated_reads = *replicated;
  options.broadcast_batch_bytes = a.broadcast_batch;
  const Result<ManifestSharing> sharing = ParseManifestSharing(a.manifest_sharing);
  if (!sharing.ok()) return Fail(rank, sharing.status().ToString());
  options.manifest_sharing = *sharing;
  options.verify_checksums = rank != a.unverified_rank;
  Result<LoadReport> report = Load(comm, a.root, held.state, options);
  if (!a.expect.empty()) {  // load-fails
    if (report.ok()) return Fail(rank, "load succeeded but was expected to fail");
    return CheckExpected(comm, a, report.status().ToString());
  }
  if (!report.ok()) return Fail(rank, "load: " + report.status().ToString());
  size_t k = 0;
  uint64_t verified = 0;
  for (const ScenarioEntry& e : ScenarioEntries()) {
    for (const Layout& layout : ScenarioLayouts(e, a.family, world, rank)) {
      if (held.buffers[k] != PieceBytes(e.name, e.dtype, e.shape, layout)) {
        return Fail(rank, "bytes differ in '" + e.name + "' " + layout.ToString());
      }
      verified += held.buffers[k++].size();
    }
  }
  if (a.expect_step >= 0 && report->step != a.expect_step) {
    return Fail(rank, "loaded step " + std::to_string(report->step) + ", expected " + std::to_string(a.expect_step));
  }
  const auto& blobs = report->blobs;
  if (!blobs.count("step") || blobs.at("step").bytes != std::to_string(report->step)) return Fail(rank, "blob 'step' wrong");
  if (!blobs.count("config") || blobs.at("config").bytes != "{\"scenario\": 1}") return Fail(rank, "blob 'config' wrong");
  if (!blobs.count("rng")) return Fail(rank, "per-rank blob 'rng' is not in the report");
  const BlobResult& rng = blobs.at("rng");
  if (a.no_rank_blobs) {
    // `shardckpt reshard` writes no per-rank blobs (they belong to the saving ranks): reported
    // unavailable, as at another world size, by the names its manifest records.
    if (rng.available || rng.reason.find("left out when the checkpoint was resharded") == std::string::npos) {
      return Fail(rank, "per-rank blob 'rng' of a resharded checkpoint: available " + std::to_string(rng.available) +
                            ", reason '" + rng.reason + "'");
    }
  } else if (report->saved_world_size == world) {
    std::string expected = "rng-" + std::to_string(rank) + "-of-" + std::to_string(world);
    if (!rng.available || rng.bytes != expected) return Fail(rank, "per-rank blob 'rng' is '" + rng.bytes + "'");
  } else if (rng.available || rng.reason.find("saved by " + std::to_string(report->saved_world_size) + " ranks") == std::string::npos) {
    return Fail(rank, "per-rank blob 'rng' should be unavailable with a reason, got '" + rng.reason + "'");
  }
  // Entries every rank wants whole are read once and broadcast when asked (or across hosts, or
  // from storage): with more entries than ranks, every rank receives some of them from their
  // readers. On one host from tmpfs by default every rank reads them itself and receives nothing.
  const char* env = std::getenv("SHARDCKPT_REPLICATED_READS");
  const std::string mode = env != nullptr && *env ? std::string(env) : a.replicated_reads;
  // Where some ranks verify and some do not, every rank reads (and verifies) its own.
  const bool all_verify = a.unverified_rank < 0;
  const bool broadcast = (mode == "broadcast" || (mode == "auto" && !IsMemoryBacked(JoinPath(report->path, "manifest.json")))) &&
                         (all_verify || world == 1);
  if (a.family == "replicated" && world > 1 && broadcast && report->bytes_received == 0) {
    return Fail(rank, "no replicated entry was received by broadcast");
  }
  if (a.family == "replicated" && world > 1 && !broadcast &&
      report->bytes_received != 0) {
    return Fail(rank, "every rank should have read the replicated entries itself, but " +
                          std::to_string(report->bytes_received) + " bytes came by broadcast");
  }
  // Read by every rank from one page cache, each block of the replicated entries is verified by
  // one rank only; from storage every rank verifies what it reads.
  const bool memory_backed = IsMemoryBacked(JoinPath(report->path, "manifest.json"));
  if (a.family == "replicated" && world > 1 && !broadcast && memory_backed && all_verify &&
      report->stats.blocks_verified_elsewhere == 0) {
    return Fail(rank, "every rank read the replicated entries from tmpfs, yet this rank verified every block itself (" +
                          std::to_string(report->stats.blocks_verified) + ")");
  }
  if ((!memory_backed || !all_verify) && report->stats.blocks_verified_elsewhere != 0) {
    return Fail(rank, std::to_string(report->stats.blocks_verified_elsewhere) + " blocks read from " +
                          (all_verify ? "storage" : "tmpfs while a rank does not verify") +
                          " were left to another rank to verify");
  }
  if (options.manifest_sharing != ManifestSharing::kAuto && world > 1 &&
      report->every_rank_parsed_manifest != (options.manifest_sharing == ManifestSharing::kEveryRankParses)) {
    return Fail(rank, "manifest sharing '" + a.manifest_sharing + "' was not followed");
  }
  if (a.expect_read_ahead == 0 && report->stats.bytes_read_ahead != 0) {
    return Fail(rank, "read " + std::to_string(report->stats.bytes_read_ahead) + " bytes ahead; expected none");
  }
  std::string why;
  if (a.expect_read_ahead == 1 && report->stats.bytes_read_ahead == 0) {
    if (testing::FastPathAvailable(report->path, &why)) {
      return Fail(rank, "read nothing ahead of the plan, although io_uring and O_DIRECT work here");
    }
    std::printf("rank %d: no read ahead here (%s)\n", rank, why.c_str());
  }
  double amplification = report->bytes_wanted ? double(report->stats.data_bytes_read) / report->bytes_wanted : 1.0;
  std::printf("rank %d/%d: OK loaded step %lld saved by %d ranks (%s layout): verified %llu bytes, read %llu data "
              "+ %llu table bytes (%llu of them ahead of the plan) for %llu wanted (amplification %.3f), received %llu by "
              "broadcast; %llu blocks verified here, %llu by another rank; manifest %s\n",
              rank, world, static_cast<long long>(report->step), report->saved_world_size, a.family.c_str(),
              static_cast<unsigned long long>(verified), static_cast<unsigned long long>(report->stats.data_bytes_read),
              static_cast<unsigned long long>(report->stats.table_bytes_read),
              static_cast<unsigned long long>(report->stats.bytes_read_ahead),
              static_cast<unsigned long long>(report->bytes_wanted), amplification,
              static_cast<unsigned long long>(report->bytes_received),
              static_cast<unsigned long long>(report->stats.blocks_verified),
              static_cast<unsigned long long>(report->stats.blocks_verified_elsewhere),
              report->every_rank_parsed_manifest ? "parsed by every rank" : "sent by rank 0");
  return 0;
}

// Async save: the snapshot must hold the values from before the caller changes its tensors
// (PyTorch DCP shipped this bug, issue 144657), staging memory is reused, and a failure in the
// background persist comes back from the handle on every rank.
int DoAsync(Communicator& comm, const Args& a) {
  const int rank = comm.rank();
  Held held = Build(a.family, comm.size(), rank, a.step, true);
  SaveOptions options;
  options.staging_buffer_bytes = a.staging_bytes;
  Result<std::unique_ptr<AsyncSaver>> saver = AsyncSaver::Create(comm, options);
  if (!saver.ok()) return Fail(rank, "async saver: " + saver.status().ToString());
  // Copy while training (--deferred): StartSave returns before the copy; the tensors change
  // only after Fence, as an optimizer step would.
  auto save = [&](int64_t step) -> Result<std::shared_ptr<SaveHandle>> {
    if (!a.deferred) return (*saver)->Save(a.root, step, held.state);
    SC_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle> handle, (*saver)->StartSave(a.root, step, held.state));
    SC_RETURN_IF_ERROR((*saver)->Fence());
    return handle;
  };
  Result<std::shared_ptr<SaveHandle>> first = save(a.step);
  if (!first.ok() && !a.expect.empty()) {  // a snapshot failure: from Save, or from the fence, on every rank
    Status waited = (*saver)->Wait();
    if (a.deferred && waited.ToString() != first.status().ToString()) {
      return Fail(rank, "the handle says '" + waited.ToString() + "' but the fence said '" + first.status().ToString() + "'");
    }
    if (int failed = CheckExpected(comm, a, first.status().ToString()); failed != 0 || !a.then_succeeds) return failed;
    // The failure was one-shot: the saver serves the next save as if nothing had happened.
    Result<std::shared_ptr<SaveHandle>> next = save(a.step + 1);
    Status persisted = next.ok() ? (*next)->Wait() : next.status();
    if (!persisted.ok()) return Fail(rank, "the save after the failed one: " + persisted.ToString());
    std::printf("rank %d: OK the next save succeeded\n", rank);
    return 0;
  }
  if (!first.ok()) return Fail(rank, "snapshot: " + first.status().ToString());
  for (auto& buffer : held.buffers) std::fill(buffer.begin(), buffer.end(), 0xEE);  // the loop moves on
  Result<std::shared_ptr<SaveHandle>> second = save(a.step + 1);
  if (!second.ok()) return Fail(rank, "second snapshot: " + second.status().ToString());
  Status s1 = (*first)->Wait(), s2 = (*second)->Wait();
  if (!a.expect.empty()) {  // a failure injected in the background must surface here
    const std::string message = s1.ok() ? s2.ToString() : s1.ToString();
    if (s1.ok() && s2.ok()) return Fail(rank, "async save succeeded but was expected to fail");
    for (const std::string& text : a.expect) {
      if (message.find(text) == std::string::npos) return Fail(rank, "async error lacks '" + text + "': " + message);
    }
    std::printf("rank %d: OK async failure surfaced from the handle: %s\n", rank, message.c_str());
    return 0;
  }
  if (!s1.ok() || !s2.ok()) return Fail(rank, "persist: " + (s1.ok() ? s2 : s1).ToString());
  // The snapshot area and each buffer of the persist's ring, once, by the first save.
  if ((*saver)->staging_allocations() != 1 + options.staging_buffers) {
    return Fail(rank, "staging memory allocated " + std::to_string((*saver)->staging_allocations()) + " times, not reused");
  }
  // The second save's layout is the first's: it reused the saver's plan.
  if ((*saver)->plan_cache().plans_made != 1 || (*saver)->plan_cache().plans_reused != 1) {
    return Fail(rank, "async saves planned " + std::to_string((*saver)->plan_cache().plans_made) + " times, reused " +
                          std::to_string((*saver)->plan_cache().plans_reused) + " times; expected 1 and 1");
  }
  std::printf("rank %d: OK two async saves, staging %llu bytes allocated once, snapshot %.4fs\n", rank,
              static_cast<unsigned long long>((*saver)->staging_bytes()), (*saver)->last_snapshot_seconds());
  // The first checkpoint holds the values from before the change.
  Args load = a;
  char step_dir[32];
  std::snprintf(step_dir, sizeof(step_dir), "step-%09lld", static_cast<long long>(a.step));
  load.root = JoinPath(a.root, step_dir);
  load.expect_step = a.step;
  return DoLoad(comm, load);
}

// Repeat saves with a SavePlanCache (save_plan_cache.h). The last rank alone changes the
// description of its own entry (dtype, shape, a new entry, its layout); every such change must
// plan afresh on every rank, and an unchanged repeat must reuse the plan on every rank.
int DoPlanCache(Communicator& comm, const Args& a) {
  const int rank = comm.rank(), world = comm.size(), changer = world - 1;
  const std::string own = "own.rank" + std::to_string(changer);
  struct Variant {
    const char* what;
    bool plans;           // expected: a fresh plan (true) or the kept one
    DType dtype;
    Shape shape;
    int pieces;           // the own entry as 1 whole piece or 2 halves
    bool extra;           // a new entry on the changing rank
  };
  const std::vector<Variant> variants = {
      {"first save", true, DType::kFloat32, {16}, 1, false},
      {"unchanged", false, DType::kFloat32, {16}, 1, false},
      {"dtype", true, DType::kInt32, {16}, 1, false},
      {"unchanged", false, DType::kInt32, {16}, 1, false},
      {"shape", true, DType::kInt32, {4, 4}, 1, false},
      {"new entry", true, DType::kInt32, {4, 4}, 1, true},
      {"layout", true, DType::kInt32, {4, 4}, 2, true},
      {"unchanged", false, DType::kInt32, {4, 4}, 2, true},
      {"back to the first", true, DType::kFloat32, {16}, 1, false},
  };
  // The scenario's state plus every rank's own entry (and the changer's extra one) as variant
  // `v` has them; `fill`: the bytes a save of `step` writes, or a poison pattern to load into.
  struct Built {
    Held held;
    std::vector<uint8_t> own = std::vector<uint8_t>(64), extra = std::vector<uint8_t>(16);
  };
  auto make = [&](int64_t step, const Variant& v, bool fill) -> Result<std::unique_ptr<Built>> {
    auto b = std::make_unique<Built>();
    b->held = Build(a.family, world, rank, step, fill);  // fresh buffers: pointers are not the layout
    std::fill(b->own.begin(), b->own.end(), fill ? static_cast<uint8_t>(step) : 0xCD);
    std::fill(b->extra.begin(), b->extra.end(), fill ? 7 : 0xCD);
    const Variant& mine = rank == changer ? v : variants[0];
    const std::string name = "own.rank" + std::to_string(rank);
    ShardedState& state = b->held.state;
    if (mine.pieces == 1) {
      SC_RETURN_IF_ERROR(state.AddTensor(name, mine.dtype, mine.shape, Layout::Whole(), b->own.data()));
    } else {  // two halves along dim 0
      Shape half = mine.shape, at(mine.shape.size(), 0);
      half[0] /= 2;
      SC_RETURN_IF_ERROR(state.AddTensor(name, mine.dtype, mine.shape, Layout::Box(at, half), b->own.data()));
      at[0] = half[0];
      SC_RETURN_IF_ERROR(state.AddTensor(name, mine.dtype, mine.shape, Layout::Box(at, half), b->own.data() + 32));
    }
    if (mine.extra) {
      SC_RETURN_IF_ERROR(state.AddTensor("extra.rank" + std::to_string(rank), DType::kUInt8, {16}, Layout::Whole(), b->extra.data()));
    }
    return b;
  };
  SavePlanCache cache;
  SaveOptions options;
  options.plan_cache = &cache;
  uint64_t made = 0, reused = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const int64_t step = a.step + static_cast<int64_t>(i);
    Result<std::unique_ptr<Built>> built = make(step, v, true);
    if (!built.ok()) return Fail(rank, std::string("building ") + v.what + ": " + built.status().ToString());
    Result<SaveResult> saved = Save(comm, a.root, step, (*built)->held.state, options);
    if (!saved.ok()) return Fail(rank, std::string("save (") + v.what + "): " + saved.status().ToString());
    (v.plans ? made : reused)++;
    if (cache.plans_made != made || cache.plans_reused != reused) {
      return Fail(rank, std::string("after the save '") + v.what + "' on rank " + std::to_string(changer) + ": planned " +
                            std::to_string(cache.plans_made) + ", reused " + std::to_string(cache.plans_reused) +
                            "; expected " + std::to_string(made) + " and " + std::to_string(reused));
    }
    // The manifest describes the changer's entry as it was saved this time, reused plan or not.
    Result<Manifest> m = ReadManifest(saved->path);
    if (!m.ok()) return Fail(rank, "manifest: " + m.status().ToString());
    const EntryRecord* entry = nullptr;
    bool has_extra = false;
    for (const EntryRecord& e : m->entries) {
      if (e.name == own) entry = &e;
      has_extra |= e.name == "extra.rank" + std::to_string(changer);
    }
    if (entry == nullptr || entry->dtype != v.dtype || entry->shape != v.shape ||
        entry->chunks.size() != static_cast<size_t>(v.pieces) || has_extra != v.extra) {
      return Fail(rank, std::string("manifest of the save '") + v.what + "' does not describe " + own + " as saved");
    }
    if (v.plans) continue;
    // A reused plan commits rank 0's kept manifest, refreshed: it must be the manifest a save
    // without the cache builds afresh for the same state, but for the creation time.
    Result<SaveResult> fresh = Save(comm, a.root + "-fresh", step, (*built)->held.state, SaveOptions{});
    if (!fresh.ok()) return Fail(rank, "save without the cache: " + fresh.status().ToString());
    Result<Manifest> built_afresh = ReadManifest(fresh->path);
    if (!built_afresh.ok()) return Fail(rank, "manifest saved without the cache: " + built_afresh.status().ToString());
    built_afresh->created.time = m->created.time;
    if (EncodeManifest(*m).value() != EncodeManifest(*built_afresh).value()) {
      return Fail(rank, std::string("the kept manifest of the save '") + v.what + "' differs from one built afresh");
    }
  }
  std::printf("rank %d: OK %zu saves planned %llu times and reused the plan %llu times\n", rank, variants.size(),
              static_cast<unsigned long long>(made), static_cast<unsigned long long>(reused));
  // A save that reused the plan (the 8th: two-piece layout, extra entry) loads back byte for byte.
  const size_t reused_save = 7;
  const int64_t step = a.step + static_cast<int64_t>(reused_save);
  Result<std::unique_ptr<Built>> target = make(step, variants[reused_save], false);
  if (!target.ok()) return Fail(rank, "building the load target: " + target.status().ToString());
  char step_dir[32];
  std::snprintf(step_dir, sizeof(step_dir), "step-%09lld", static_cast<long long>(step));
  Result<LoadReport> report = Load(comm, JoinPath(a.root, step_dir), (*target)->held.state);
  if (!report.ok()) return Fail(rank, "load: " + report.status().ToString());
  Result<std::unique_ptr<Built>> expected = make(step, variants[reused_save], true);
  if ((*target)->held.buffers != (*expected)->held.buffers || (*target)->own != (*expected)->own ||
      (rank == changer && (*target)->extra != (*expected)->extra)) {
    return Fail(rank, "the checkpoint saved with a reused plan loads back different bytes");
  }
  std::printf("rank %d: OK step %lld (reused plan) loads back byte for byte\n", rank, static_cast<long long>(step));
  return 0;
}

// Readers against retention (issue 16 part 0): a loop of saves with keep_last while another job
// loops loads of the root; each load must resolve a checkpoint and read it whole.
int DoSaveLoop(Communicator& comm, const Args& a) {
  SaveOptions options;
  options.keep_last = a.keep_last;
  for (int64_t step = a.step; step < a.step + a.count; ++step) {
    Held held = Build(a.family, comm.size(), comm.rank(), step, true);
    Result<SaveResult> saved = Save(comm, a.root, step, held.state, options);
    if (!saved.ok()) return Fail(comm.rank(), "save of step " + std::to_string(step) + ": " + saved.status().ToString());
  }
  std::printf("rank %d: OK saved %lld steps with keep_last %d\n", comm.rank(), static_cast<long long>(a.count), a.keep_last);
  return 0;
}

int DoLoadLoop(Communicator& comm, const Args& a) {
  for (int64_t i = 0; i < a.count; ++i) {
    if (int code = DoLoad(comm, a)) return code;
  }
  return 0;
}

// 0 when `message` holds every --expect text.
int CheckExpected(Communicator& comm, const Args& a, const std::string& message) {
  for (const std::string& text : a.expect) {
    if (message.find(text) == std::string::npos) return Fail(comm.rank(), "error lacks '" + text + "': " + message);
  }
  std::printf("rank %d: OK failed as expected: %s\n", comm.rank(), message.c_str());
  return 0;
}

int DoSaveFails(Communicator& comm, const Args& a) {
  Held held = Build(a.family, comm.size(), comm.rank(), a.step, true);
  Result<SaveResult> saved = Save(comm, a.root, a.step, held.state);
  if (saved.ok()) return Fail(comm.rank(), "save succeeded but was expected to fail");
  return CheckExpected(comm, a, saved.status().ToString());
}

// AsyncSaver::Create duplicates the communicator, a collective: it must fail by the deadline too.
int DoAsyncCreateFails(Communicator& comm, const Args& a) {
  Result<std::unique_ptr<AsyncSaver>> saver = AsyncSaver::Create(comm, SaveOptions());
  if (saver.ok()) return Fail(comm.rank(), "AsyncSaver::Create succeeded but was expected to fail");
  return CheckExpected(comm, a, saver.status().ToString());
}

// Loads `root` into the scenario's layout and checks every byte and the step blob.
Result<int64_t> LoadAndCheck(Communicator& comm, const Args& a, const std::string& root) {
  Held held = Build(a.family, comm.size(), comm.rank(), 0, false, a.tiny);
  SC_ASSIGN_OR_RETURN(LoadReport report, Load(comm, root, held.state));
  size_t k = 0;
  for (const ScenarioEntry& e : ScenarioEntries()) {
    if (a.tiny && NumElements(e.shape).value() > 4096) continue;
    for (const Layout& layout : ScenarioLayouts(e, a.family, comm.size(), comm.rank())) {
      if (held.buffers[k++] != PieceBytes(e.name, e.dtype, e.shape, layout)) {
        return Internal("bytes differ in '" + e.name + "' " + layout.ToString());
      }
    }
  }
  if (!report.blobs.count("step") || report.blobs.at("step").bytes != std::to_string(report.step)) {
    return Internal("blob 'step' does not match step " + std::to_string(report.step));
  }
  return report.step;
}

Status RunOperation(Communicator& comm, const Args& a) {
  if (a.op == "load") return LoadAndCheck(comm, a, a.root).status();
  Held held = Build(a.family, comm.size(), comm.rank(), a.step, true, a.tiny);
  SaveOptions options;
  options.staging_buffer_bytes = a.staging_bytes;
  if (a.op == "save") return Save(comm, a.root, a.step, held.state, options).status();
  if (a.op != "async") return InvalidArgument("unknown --op " + a.op);
  SC_ASSIGN_OR_RETURN(std::unique_ptr<AsyncSaver> saver, AsyncSaver::Create(comm, options));
  SC_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle> handle, saver->Save(a.root, a.step, held.state));
  return handle->Wait();
}

// One line per rank for the agreement campaign, which compares them across ranks.
int DoOutcome(Communicator& comm, const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  Status status = RunOperation(comm, a);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d outcome: %s\n", comm.rank(), status.ok() ? "OK" : status.ToString().c_str());
  std::printf("rank %d took %.3f s\n", comm.rank(), seconds);
  std::fflush(stdout);
  SetFailpoints("").IgnoreError();
  Result<int64_t> after = LoadAndCheck(comm, a, a.root);
  if (!after.ok()) return Fail(comm.rank(), "load after the operation: " + after.status().ToString());
  std::printf("rank %d after: step %lld\n", comm.rank(), static_cast<long long>(*after));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 2;
  }
  int code = 2;
  if (argc >= 3 && std::string(argv[1]) == "misuse-after") {
    // Ranks naming different checkpoints to load get rank 0's (it resolves for all: a rank's stale
    // view of a network filesystem must not decide), with a warning; a save after MPI_Finalize is
    // a Status on every rank, not Open MPI's abort.
    auto comm = CreateMpiCommunicator().value();
    const int rank = comm->rank();
    const std::string root = argv[2];
    for (int64_t step : {1, 2}) {
      Held held = Build("mixed", comm->size(), rank, step, true);
      if (!Save(*comm, root, step, held.state).ok()) return Fail(rank, "the saves before the misuse failed");
    }
    const std::string mine = rank == 1 ? JoinPath(root, StepDirName(1)) : root + "/";
    Held into = Build("mixed", comm->size(), rank, 0, false);
    Result<LoadReport> differ = Load(*comm, mine, into.state);
    if (!differ.ok() || differ->step != 2) {
      return Fail(rank, "ranks naming different checkpoints: " + (differ.ok() ? "step " + std::to_string(differ->step)
                                                                              : differ.status().ToString()));
    }
    // A save whose ranks spell one root two ways commits, with no word; one where a rank names
    // another folder fails, each rank saying which folders first.
    Held third = Build("mixed", comm->size(), rank, 3, true);
    Result<SaveResult> spelled = Save(*comm, rank == 2 ? root + "//" : root, 3, third.state);
    if (!spelled.ok()) return Fail(rank, "one root spelled two ways: " + spelled.status().ToString());
    Held fourth = Build("mixed", comm->size(), rank, 4, true);
    Result<SaveResult> other = Save(*comm, rank == 2 ? root + "-other" : root, 4, fourth.state);
    if (other.ok()) return Fail(rank, "a save with a rank in another folder committed");
    std::printf("rank %d: step 4 refused: %s\n", rank, other.status().ToString().c_str());
    // One where the rank in another folder has nothing to write (one replicated tensor, written
    // by rank 0) commits: every rank returns the folder rank 0 committed.
    std::vector<float> replicated(10, 5.0f);
    ShardedState fifth;
    if (!fifth.AddTensor("w", DType::kFloat32, {10}, Layout::Whole(), replicated.data()).ok()) return Fail(rank, "state");
    // At step 6 that folder holds a step folder of its own (an older checkpoint there): still
    // rank 0's is returned, not that one.
    for (int64_t step : {5, 6}) {
      const std::string elsewhere = JoinPath(root + "-other", StepDirName(step));
      if (rank == 2 && step == 6 && !MakeDirs(elsewhere).ok()) return Fail(rank, "mkdir " + elsewhere);
      Result<SaveResult> apart = Save(*comm, rank == 2 ? root + "-other" : root, step, fifth);
      const std::string committed = JoinPath(AbsoluteRoot(root), StepDirName(step));
      if (!apart.ok() || (rank == 2 ? apart->path != committed : apart->path != JoinPath(root, StepDirName(step))) ||
          !PathExists(committed) || PathExists(elsewhere) != (step == 6)) {
        return Fail(rank, "step " + std::to_string(step) + ", rank 2 in another folder with nothing to write: " +
                              (apart.ok() ? apart->path : apart.status().ToString()));
      }
    }
    session->reset();  // MPI_Finalize
    Held again = Build("mixed", comm->size(), rank, 7, true);
    Result<SaveResult> after = Save(*comm, root, 7, again.state);
    const bool refused = !after.ok() && after.status().code() == Code::kFailedPrecondition &&
                         after.status().message().find("MPI is already finalized") != std::string::npos;
    std::printf("rank %d: %s %s\n", rank, refused ? "OK" : "FAIL:", after.ok() ? "saved" : after.status().ToString().c_str());
    std::fflush(stdout);
    return refused ? 0 : 1;
  }
  if (argc >= 3 && std::string(argv[1]) == "dead-rank-create") {
    // Rank 2 leaves (finalizes, then waits) before the communicator exists; the others must
    // fail creating it within the deadline, not wait in MPI_Comm_dup for good.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 2) {
      std::printf("rank %d: leaving before the communicator exists\n", rank);
      std::fflush(stdout);
      return 0;
    }
    Result<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator();
    const std::string got = comm.ok() ? "OK" : comm.status().ToString();
    const bool expected = !comm.ok() && comm.status().code() == Code::kDeadlineExceeded &&
                          got.find("MPI_Comm_dup (shardckpt's communicator) gave up after") != std::string::npos &&
                          got.find("some rank never reached it") != std::string::npos;
    std::printf("rank %d: %s %s\n", rank, expected ? "OK failed as expected:" : "FAIL:", got.c_str());
    std::fflush(stdout);
    return expected ? 1 : 2;
  }
  {
    auto comm = CreateMpiCommunicator().value();
    Args a;
    if (argc < 3) {
      std::fprintf(stderr, "usage: %s save|load|roundtrip|save-fails ROOT [--step S] [--family F] ...\n", argv[0]);
      return 2;
    }
    a.mode = argv[1];
    a.root = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
      std::string flag = argv[i];
      if (flag == "--step") a.step = std::atoll(argv[i + 1]);
      else if (flag == "--family") a.family = argv[i + 1];
      else if (flag == "--expect-step") a.expect_step = std::atoll(argv[i + 1]);
      else if (flag == "--staging-bytes") a.staging_bytes = std::strtoull(argv[i + 1], nullptr, 10);
      else if (flag == "--expect") a.expect.push_back(argv[i + 1]);
      else if (flag == "--victim") a.victim = std::atoi(argv[i + 1]);
      else if (flag == "--count") a.count = std::atoll(argv[i + 1]);
      else if (flag == "--keep-last") a.keep_last = std::atoi(argv[i + 1]);
      else if (flag == "--victim-does") a.victim_does = argv[i + 1];
      else if (flag == "--op") a.op = argv[i + 1];
      else if (flag == "--tiny") a.tiny = std::atoi(argv[i + 1]) != 0;
      else if (flag == "--replicated-reads") a.replicated_reads = argv[i + 1];
      else if (flag == "--manifest-sharing") a.manifest_sharing = argv[i + 1];
      else if (flag == "--unverified-rank") a.unverified_rank = std::atoi(argv[i + 1]);
      else if (flag == "--deferred") a.deferred = std::atoi(argv[i + 1]) != 0;
      else if (flag == "--then-succeeds") a.then_succeeds = std::atoi(argv[i + 1]) != 0;
      else if (flag == "--broadcast-batch") a.broadcast_batch = std::strtoull(argv[i + 1], nullptr, 10);
      else if (flag == "--many-small") AddManySmallEntries(std::atoi(argv[i + 1]));
      else if (flag == "--no-rank-blobs") a.no_rank_blobs = std::atoi(argv[i + 1]) != 0;
      else if (flag == "--expect-read-ahead") a.expect_read_ahead = std::atoi(argv[i + 1]);
      else if (flag == "--pid-dir") {
        std::ofstream(JoinPath(argv[i + 1], "rank-" + std::to_string(comm->rank()) + ".pid")) << ::getpid() << "\n";
      }
    }
    if (!IsKnownFamily(a.family)) {
      std::fprintf(stderr, "unknown family %s\n", a.family.c_str());
      return 2;
    }
    if (a.mode == "save") code = DoSave(*comm, a);
    else if (a.mode == "load" || a.mode == "load-fails") code = DoLoad(*comm, a);
    else if (a.mode == "roundtrip") code = DoSave(*comm, a) || DoLoad(*comm, a);
    else if (a.mode == "save-fails") code = DoSaveFails(*comm, a);
    else if (a.mode == "async") code = DoAsync(*comm, a);
    else if (a.mode == "save-loop") code = DoSaveLoop(*comm, a);
    else if (a.mode == "plan-cache") code = DoPlanCache(*comm, a);
    else if (a.mode == "load-loop") code = DoLoadLoop(*comm, a);
    else if (a.mode == "outcome") code = DoOutcome(*comm, a);
    else if (a.mode == "dead-rank" || a.mode == "dead-rank-async") {
      if (comm->rank() == a.victim) {
        // Leaves before the first collective of the save: exits the way a finished or
        // confused rank does (MPI_Finalize, then wait), or hangs as one stuck in I/O does.
        std::printf("rank %d: leaving before the save (%s)\n", comm->rank(), a.victim_does.c_str());
        std::fflush(stdout);
        if (a.victim_does == "hang") ::sleep(600);
        if (a.victim_does == "broadcast") {
          // Alive and in a collective, but another one than the others are in (a load's first
          // while they save): their diagnosis must say so, not blame the transport. Two seconds
          // late, so that its own deadline passes after theirs: on a loaded machine its census
          // and abort could otherwise end the job before they report.
          ::sleep(2);
          std::string bytes(64, 'x');
          Status broadcast = comm->Broadcast(bytes.data(), bytes.size(), 0);
          std::printf("rank %d: broadcast: %s\n", comm->rank(), broadcast.ToString().c_str());
          std::fflush(stdout);
          ::sleep(600);
        }
        return 0;
      }
      code = a.mode == "dead-rank" ? DoSaveFails(*comm, a) : DoAsyncCreateFails(*comm, a);
    }
    // Every rank's verdict decides the exit status of all, so mpirun reports any failure.
    int64_t worst = code;
    comm->AllReduceMaxInt64(&worst, 1).IgnoreError();
    code = static_cast<int>(worst);
  }
  return code;
}
