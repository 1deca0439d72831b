// bench_save_load: sharded save and same-layout load against fio's write and read of the same
// bytes per rank (bench_fio.h: io_uring, O_DIRECT, 8 MiB, QD16, one job per rank), the old
// one-request-at-a-time O_DIRECT baseline, and per-rank torch.save in Python plus fsync
// (benchmarks/torch_save_rank.py), all in one run on the same folder.
//
//   mpirun -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout flat --dir /tmp/b
//
// --keep-best K saves with retention keep_last=1 and keep_best=K by a varying metric, so each save
// ranks every checkpoint it keeps (its commit phase shows what that costs).
//
// --many-small N adds N small tensors (4 B to 16 KiB, log-uniform, as tests/packing/small_tensors.py
// makes them; every 97th 0-d) in the chosen layout, so each is cut into one piece per rank: the
// per-chunk costs of issue 14 part 5 against fio moving the same bytes. The torch.save baseline
// is skipped then (its tensor list would not fit a command line).
//
// Throughputs are checkpoint bytes / wall time between barriers (fio: its bytes / its longest
// job's runtime); each figure is the median of --iters runs. The last line is JSON.
#include <torch/torch.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "benchmarks/bench_process.h"
#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/background_removal.h"
#include "shardckpt/engine/core/retention.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/torch/torch_adapter.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

// Seed of the generator behind a rank's tensors: replicas must be equal on every rank.
int SeedOf(const std::string& layout, int rank) { return 1234 + (layout == "replicated" ? 0 : rank); }

// Per-rank tensors of `layout` whose local sizes add up to about bytes_per_rank.
struct Workload {
  std::vector<at::Tensor> local;
  std::vector<Shape> global;
  std::vector<Layout> layouts;
  uint64_t bytes = 0;
};

// Replicas must hold equal values on every rank (the save writes one of them), so the values
// come from a generator seeded the same everywhere; load targets start zeroed.
// Tensors on 4096-byte boundaries (as pinned or page-allocated host buffers are) are written in
// place with O_DIRECT; libtorch's allocator aligns to 64 bytes, so its tensors go through staging.
at::Tensor PageAlignedLike(const at::Tensor& values) {
  void* memory = nullptr;
  const size_t bytes = static_cast<size_t>(values.numel()) * values.element_size();
  if (posix_memalign(&memory, 4096, std::max<size_t>(bytes, 1)) != 0) std::abort();
  at::Tensor t = at::from_blob(memory, values.sizes(), [](void* p) { std::free(p); }, values.options());
  t.copy_(values);
  return t;
}

bool g_page_aligned = false;


// Piece `rank` of `global` in `layout` (0-d tensors: whole on every rank, or on rank 0 for dim0).
Layout LayoutOf(const std::string& layout, const Shape& global, int world, int rank) {
  if (layout == "flat") return FlatShardLayout(global, world, rank);
  if (layout == "dim0") {
    if (global.empty()) return rank == 0 ? Layout::Whole() : Layout::FlatRange(1, 1);
    return ChunkLayout(global, 0, world, rank);
  }
  return Layout::Whole();
}

// The global shapes of --many-small: the same on every rank (a fixed generator).
std::vector<Shape> SmallShapes(int count) {
  std::vector<Shape> shapes;
  uint64_t x = 14;
  for (int i = 0; i < count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
    const int64_t bytes = static_cast<int64_t>(std::exp(std::log(4.0) + u * (std::log(16384.0) - std::log(4.0))));
    const int64_t numel = std::max<int64_t>(1, bytes / 4);
    if (i % 97 == 0) shapes.push_back({});
    else if (i % 3 == 0 && numel >= 32) shapes.push_back({numel / 16, 16});
    else shapes.push_back({numel});
  }
  return shapes;
}

Workload MakeWorkload(uint64_t bytes_per_rank, int tensors, const std::string& layout, int world, int rank, bool zeroed,
                      int many_small = 0) {
  Workload w;
  at::manual_seed(SeedOf(layout, rank));
  std::vector<Shape> globals = SmallShapes(many_small);
  const int64_t cols = 1024;
  int64_t local_rows = std::max<int64_t>(1, static_cast<int64_t>(bytes_per_rank / tensors / (cols * 4)));
  for (int t = 0; t < tensors; ++t) {
    globals.push_back(layout == "replicated" ? Shape{local_rows, cols} : Shape{local_rows * world, cols});
  }
  for (const Shape& global : globals) {
    Layout l = LayoutOf(layout, global, world, rank);
    Shape local_shape = LocalShape(l, global);
    std::vector<int64_t> sizes(local_shape.begin(), local_shape.end());
    at::Tensor tensor = zeroed ? at::zeros(sizes) : at::rand(sizes);
    if (g_page_aligned) tensor = PageAlignedLike(tensor);
    w.bytes += tensor.numel() * 4;
    w.local.push_back(tensor);
    w.global.push_back(global);
    w.layouts.push_back(l);
  }
  return w;
}

ShardedState StateOf(Workload& w) {
  ShardedState state;
  for (size_t t = 0; t < w.local.size(); ++t) {
    CheckOrExit(AddTorchTensor(state, "layer." + std::to_string(t) + ".weight", w.local[t], w.layouts[t], w.global[t]),
                "tensor " + std::to_string(t));
  }
  return state;
}


// One rank's torch.save in a Python child (torch_save_rank.py) holding the same tensors.
class TorchSaveBaseline {
 public:
  static Result<TorchSaveBaseline> Start(const std::string& python, const std::string& script, const std::string& path,
                                         int seed, const Workload& w) {
    std::string shapes;
    for (const at::Tensor& t : w.local) {
      if (!shapes.empty()) shapes += ",";
      shapes += std::to_string(t.size(0)) + "x" + std::to_string(t.numel() / std::max<int64_t>(1, t.size(0)));
    }
    Result<Child> child = Spawn({python, script, "--path", path, "--seed", std::to_string(seed), "--shapes", shapes});
    if (!child.ok()) return child.status();
    TorchSaveBaseline b;
    b.child_ = *child;
    if (ReadLine(b.child_.out) != "ready") return Internal(script + " did not start: " + Finish(b.child_, script).ToString());
    b.sum0_ = w.local[0].to(at::kDouble).sum().item<double>();
    return b;
  }
  // Saves once; the file's size and the seconds Python measured around torch.save + fsync.
  Status SaveOnce(double* seconds, uint64_t* bytes) {
    if (::write(child_.in, "go\n", 3) != 3) return Internal("torch.save baseline: child gone");
    nlohmann::json r = nlohmann::json::parse(ReadLine(child_.out), nullptr, false);
    if (r.is_discarded() || !r.contains("seconds")) return Internal("torch.save baseline failed (see its stderr)");
    double sum0 = r["sum0"].get<double>();
    if (std::fabs(sum0 - sum0_) > 1e-6 * std::fabs(sum0_)) {
      return Internal("torch.save baseline holds other tensors than ours (first sum " + std::to_string(sum0) + " vs " +
                      std::to_string(sum0_) + ")");
    }
    *seconds = r["seconds"].get<double>();
    *bytes = r["bytes"].get<uint64_t>();
    return Status::Ok();
  }
  Status Stop() { return Finish(child_, "torch.save baseline"); }

 private:
  Child child_;
  double sum0_ = 0;
};

// Each phase's seconds over the iterations, in the order the engine reports them.
using PhaseSeries = std::vector<std::pair<std::string, std::vector<double>>>;

void AddPhases(const std::vector<PhaseTime>& phases, PhaseSeries* series) {
  for (const PhaseTime& phase : phases) {
    auto it = std::find_if(series->begin(), series->end(), [&](const auto& s) { return s.first == phase.name; });
    if (it == series->end()) it = series->insert(series->end(), {phase.name, {}});
    it->second.push_back(phase.seconds);
  }
}

std::string DescribePhases(const PhaseSeries& series) {
  std::string text;
  char number[32];
  for (const auto& [name, seconds] : series) {
    std::snprintf(number, sizeof(number), "%.4f", Median(seconds));
    text += (text.empty() ? "" : ", ") + name + " " + number;
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = CreateMpiCommunicator().value();
  po::options_description flags("bench_save_load");
  flags.add_options()("help", "this text")
      ("bytes-per-rank", po::value<std::string>()->default_value("256MiB"), "state size per rank")
      ("tensors", po::value<int>()->default_value(16), "tensors per rank")
      ("layout", po::value<std::string>()->default_value("flat"), "flat | dim0 | replicated")
      ("page-aligned", "tensors on 4096-byte boundaries (written in place) instead of libtorch's 64-byte ones (staged)")
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench"), "folder to write in")
      ("iters", po::value<int>()->default_value(3), "repetitions (median reported)")
      ("async", "also measure async save (see issue 6)")
      ("plan-cache", "keep the save plan between iterations, as a training loop's repeated saves do (the first save plans; the median then shows repeats)")
      ("many-small", po::value<int>()->default_value(0), "also this many small tensors (4 B to 16 KiB), cut per rank")
      ("keep-best", po::value<int>()->default_value(0),
       "save with retention keep_last=1, keep_best=K by a metric that varies per save, applied inside the save (which "
       "ranks every kept checkpoint), instead of removing the previous checkpoint after it")
      ("read-ahead-max", po::value<std::string>()->default_value(""),
       "LoadOptions::read_ahead_max_bytes (e.g. 0 to turn reading a rank's own file during the metadata phases off, or "
       "256MiB); empty: the default")
      ("manifest-sharing", po::value<std::string>()->default_value("auto"),
       "LoadOptions::manifest_sharing: auto | root (rank 0 sends a binary message) | every-rank (every rank parses)")
      ("python", po::value<std::string>()->default_value("/usr/bin/python3"), "Python with torch, for the torch.save baseline")
      ("torch-script", po::value<std::string>()->default_value(SHARDCKPT_BENCH_DIR "/torch_save_rank.py"), "the torch.save baseline");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  po::notify(vm);
  if (vm.count("help")) {
    if (comm->rank() == 0) std::cout << flags << "\n";
    return 0;
  }
  const uint64_t bytes_per_rank = ParseSize(vm["bytes-per-rank"].as<std::string>());
  const std::string layout = vm["layout"].as<std::string>();
  const std::string dir = vm["dir"].as<std::string>();
  const int iters = vm["iters"].as<int>();
  g_page_aligned = vm.count("page-aligned") > 0;
  const int rank = comm->rank(), world = comm->size();
  if (rank == 0) {
    RemoveTree(dir).IgnoreError();
    MakeDirs(dir).IgnoreError();
  }
  comm->Barrier().IgnoreError();

  const int many_small = vm["many-small"].as<int>();
  const int keep_best = vm["keep-best"].as<int>();
  LoadOptions load_options;
  if (!vm["read-ahead-max"].as<std::string>().empty()) {
    const std::string max = vm["read-ahead-max"].as<std::string>();
    load_options.read_ahead_max_bytes = max == "0" ? 0 : ParseSize(max);  // sizes are positive; 0 is "off"
  }
  const Result<ManifestSharing> sharing = ParseManifestSharing(vm["manifest-sharing"].as<std::string>());
  CheckOrExit(sharing.status(), "--manifest-sharing");
  load_options.manifest_sharing = *sharing;
  uint64_t read_ahead_bytes = 0;  // rank 0's, in the last load
  bool every_rank_parsed = false;
  Workload work = MakeWorkload(bytes_per_rank, vm["tensors"].as<int>(), layout, world, rank, false, many_small);
  double total_bytes = static_cast<double>(work.bytes);
  comm->AllReduceSumDouble(&total_bytes, 1).IgnoreError();
  if (layout == "replicated") total_bytes = static_cast<double>(work.bytes);  // one copy is the checkpoint
  ShardedState state = StateOf(work);
  const std::string raw_path = JoinPath(dir, "raw-" + std::to_string(rank));  // fio's file too
  // Replicated state is written once in total, so its raw baselines move the bytes each rank
  // writes; in whole fio blocks, so that fio and the old baseline move the same bytes.
  uint64_t raw_bytes = FioBytes(layout == "replicated" ? work.bytes / world : work.bytes);
  double raw_total = static_cast<double>(raw_bytes) * world;
  const bool with_torch = many_small == 0;
  Result<TorchSaveBaseline> torch_save = Internal("not started");
  if (with_torch) {
    torch_save = TorchSaveBaseline::Start(vm["python"].as<std::string>(), vm["torch-script"].as<std::string>(),
                                          JoinPath(dir, "torch-" + std::to_string(rank) + ".pt"), SeedOf(layout, rank), work);
    CheckOrExit(AgreeOnStatus(*comm, torch_save.status()), "starting the torch.save baseline");
  }

  SavePlanCache plan_cache;
  const bool keep_plan = vm.count("plan-cache") > 0;
  std::vector<double> fio_w, fio_r, raw_w, raw_r, save_t, load_t, torch_t, retention_t, retention_bg_t;
  PhaseSeries save_phases, load_phases;
  double torch_written = 0, our_written = 0;
  for (int it = 0; it < iters; ++it) {
    FioRun fw = FioForRanks(*comm, dir, "raw-", raw_bytes, /*write=*/true);
    FioRun fr = FioForRanks(*comm, dir, "raw-", raw_bytes, /*write=*/false);
    fio_w.push_back(fw.GiBPerSecond());
    fio_r.push_back(fr.GiBPerSecond());
    if (rank == 0 && it == 0) std::printf("  %s\n  %s\n", DescribeFio(fw, "write").c_str(), DescribeFio(fr, "read").c_str());
    Status raw;
    raw_w.push_back(TimeCollective(*comm, [&] { raw = RawDirectWrite(raw_path, raw_bytes); }));
    CheckOrExit(AgreeOnStatus(*comm, raw), "raw write baseline");
    raw_r.push_back(TimeCollective(*comm, [&] { raw = RawDirectRead(raw_path, raw_bytes); }));
    CheckOrExit(AgreeOnStatus(*comm, raw), "raw read baseline");
    const std::string root = JoinPath(dir, "ckpt");
    SaveOptions save_options;
    if (keep_plan) save_options.plan_cache = &plan_cache;
    if (keep_best > 0) {
      save_options.keep_last = 1;
      save_options.keep_best = keep_best;
      save_options.best_metric = "loss";
      save_options.metrics["loss"] = 1.0 + (it * 7 % 13) * 0.01;  // no trend: the best are spread over the run
    }
    // The save alone is timed; deleting the previous checkpoint (what keep_last=1 would do in the
    // same call) is timed on its own below, so both figures are visible.
    Result<SaveResult> saved = Internal("not run");
    save_t.push_back(TimeCollective(*comm, [&] { saved = Save(*comm, root, it + 1, state, save_options); }));
    if (!saved.ok()) {  // Save returns the same Status on every rank
      std::fprintf(stderr, "rank %d: save failed: %s\n", rank, saved.status().ToString().c_str());
      return 1;
    }
    our_written = static_cast<double>(saved->total_bytes);
    AddPhases(saved->phases, &save_phases);
    if (it > 0 && keep_best == 0) {
      RetentionPolicy keep_one;
      keep_one.keep_last = 1;
      Status pruned;
      // As a save applies it: the part in the save call (the old checkpoint retired), then the
      // background deletion of its files, which a training loop overlaps with its steps.
      retention_t.push_back(TimeCollective(*comm, [&] {
        if (rank == 0) pruned = ApplyRetention(root, keep_one, StepDirName(it + 1), false, Removal::kInBackground).status();
      }));
      retention_bg_t.push_back(TimeCollective(*comm, [&] {
        if (rank == 0) WaitForBackgroundRemovals();
      }));
      CheckOrExit(AgreeOnStatus(*comm, pruned), "removing the previous checkpoint");
    }
    Workload into = MakeWorkload(bytes_per_rank, vm["tensors"].as<int>(), layout, world, rank, true, many_small);
    ShardedState targets = StateOf(into);
    Status loaded;
    load_t.push_back(TimeCollective(*comm, [&] {
      Result<LoadReport> report = Load(*comm, root, targets, load_options);
      loaded = report.status();
      if (report.ok()) AddPhases(report->phases, &load_phases);
      if (report.ok()) read_ahead_bytes = report->stats.bytes_read_ahead;
      if (report.ok()) every_rank_parsed = report->every_rank_parsed_manifest;
    }));
    bool equal = loaded.ok();
    for (size_t t = 0; equal && t < work.local.size(); ++t) equal = into.local[t].equal(work.local[t]);
    // Every rank learns of a failure on any rank, so none is left waiting in a barrier.
    Status verdict = AgreeOnStatus(*comm, equal ? Status::Ok() : DataLoss("loaded tensors differ: " + loaded.ToString()));
    if (!verdict.ok()) {
      std::fprintf(stderr, "rank %d: load check failed: %s\n", rank, verdict.ToString().c_str());
      return 1;
    }
    if (!with_torch) continue;
    double python_s = 0;
    uint64_t file_bytes = 0;
    Status torch_status;
    torch_t.push_back(TimeCollective(*comm, [&] { torch_status = torch_save->SaveOnce(&python_s, &file_bytes); }));
    CheckOrExit(AgreeOnStatus(*comm, torch_status), "torch.save baseline");
    // torch.save per rank writes every replica once per rank: count what it writes.
    torch_written = static_cast<double>(file_bytes);
    comm->AllReduceSumDouble(&torch_written, 1).IgnoreError();
  }
  if (with_torch) CheckOrExit(AgreeOnStatus(*comm, torch_save->Stop()), "torch.save baseline");
  // Async: blocking time of the snapshot (warm saver: staging already allocated) against a plain
  // memcpy of the same bytes into the same kind of (page-aligned, pre-faulted) memory.
  std::vector<double> async_t, memcpy_t;
  if (vm.count("async")) {
    auto saver = AsyncSaver::Create(*comm).value();
    AlignedBuffer target = AlignedBuffer::Allocate(work.bytes + 4096 * work.local.size()).value();
    std::memset(target.data(), 0, target.size());
    const std::string root = JoinPath(dir, "async");
    for (int it = 0; it <= iters; ++it) {
      double block = TimeCollective(*comm, [&] { saver->Save(root, it + 1, state).status().IgnoreError(); });
      if (!saver->Wait().ok()) return 1;
      if (it > 0) async_t.push_back(block);  // the first save allocates and faults the staging area
      memcpy_t.push_back(TimeCollective(*comm, [&] {
        size_t at = 0;
        for (auto& t : work.local) {
          std::memcpy(target.data() + at, t.data_ptr(), t.numel() * 4);
          at += (t.numel() * 4 + 4095) / 4096 * 4096;
        }
      }));
    }
  }
  double save = GiBPerSecond(total_bytes, Median(save_t)), load = GiBPerSecond(total_bytes, Median(load_t));
  double fw = Median(fio_w), fr = Median(fio_r);
  double rw = GiBPerSecond(raw_total, Median(raw_w)), rr = GiBPerSecond(raw_total, Median(raw_r));
  double torch_s = torch_t.empty() ? 0 : Median(torch_t), ts = GiBPerSecond(total_bytes, torch_s), save_s = Median(save_t);
  if (rank == 0) {
    std::printf("bench_save_load: %d ranks, %.1f MiB per rank, %s layout, %zu tensors (%d small), %d iters, dir %s\n",
                world, work.bytes / 1048576.0, layout.c_str(), work.local.size(), many_small, iters, dir.c_str());
    std::printf("  fio write %.3f GiB/s, read %.3f GiB/s (medians; %.0f MiB in all, one job per rank)\n", fw, fr,
                raw_total / 1048576);
    std::printf("  old sync 8 MiB pwrite/pread baseline: write %.3f GiB/s, read %.3f GiB/s\n", rw, rr);
    if (keep_best > 0) {
      Result<std::vector<CheckpointInfo>> kept = ListCheckpoints(JoinPath(dir, "ckpt"), false);
      const auto committed = kept.ok() ? std::count_if(kept->begin(), kept->end(), [](const CheckpointInfo& c) { return c.committed; }) : 0;
      std::printf("  each save applied keep_last=1, keep_best=%d: %ld checkpoints committed in the root at the end\n",
                  keep_best, static_cast<long>(committed));
    }
    if (keep_plan) {
      std::printf("  plan kept between saves: %llu planned, %llu reused, %llu manifest bodies written early; first save %.3fs\n",
                  static_cast<unsigned long long>(plan_cache.plans_made),
                  static_cast<unsigned long long>(plan_cache.plans_reused),
                  static_cast<unsigned long long>(plan_cache.manifests_written_early), save_t.front());
    }
    std::printf("  shardckpt save %.3f GiB/s (%.2fx fio write, %.2fx old raw), load %.3f GiB/s (%.2fx fio read, %.2fx old raw)\n",
                save, save / fw, save / rw, load, load / fr, load / rr);
    // On tmpfs io_uring can read slower than the synchronous loop: the stronger one is the baseline.
    std::printf("  against the stronger baseline: save %.2fx (%s), load %.2fx (%s)\n", save / std::max(fw, rw),
                fw >= rw ? "fio" : "old sync", load / std::max(fr, rr), fr >= rr ? "fio" : "old sync");
    if (with_torch) std::printf("  torch.save+fsync per rank (Python): %.3fs, %.0f MiB written; shardckpt save %.3fs, %.0f MiB written:"
                " torch.save takes %.2fx shardckpt's time\n", torch_s, torch_written / 1048576, save_s, our_written / 1048576, torch_s / save_s);
    // Where rank 0's time went (SaveResult::phases, LoadReport::phases), medians over the iterations.
    std::printf("  rank 0 save phases (s): %s\n  rank 0 load phases (s): %s; %.1f MiB of its own file read ahead; "
                "manifest %s\n", DescribePhases(save_phases).c_str(), DescribePhases(load_phases).c_str(),
                static_cast<double>(read_ahead_bytes) / 1048576, every_rank_parsed ? "parsed by every rank" : "sent by rank 0");
    std::map<std::string, std::string> extra;
    if (!retention_t.empty()) {
      // What keep_last=1 adds to a save: retiring the previous checkpoint; freeing its files
      // follows on a helper thread.
      const double prune = Median(retention_t), freeing = Median(retention_bg_t);
      std::printf("  keep_last=1 adds %.3fs to the save (the previous checkpoint retired): save with it %.2fx fio write;"
                  " freeing its files takes %.3fs more in the background\n",
                  prune, GiBPerSecond(total_bytes, save_s + prune) / fw, freeing);
      extra["retention_s"] = Num(prune);
      extra["retention_background_s"] = Num(freeing);
      extra["save_with_retention_vs_fio"] = Num(GiBPerSecond(total_bytes, save_s + prune) / fw);
    }
    if (!async_t.empty()) {
      double block = Median(async_t), copy = Median(memcpy_t), sync = Median(save_t);
      std::printf("  async save blocks %.4fs: %.2fx a memcpy of the same bytes (%.4fs), %.1f%% of a sync save (%.3fs)\n",
                  block, block / copy, copy, 100 * block / sync, sync);
      extra = {{"async_block_s", Num(block)}, {"memcpy_s", Num(copy)}, {"async_block_vs_memcpy", Num(block / copy)},
               {"async_block_vs_sync", Num(block / sync)}};
    }
    std::map<std::string, std::string> fields = {{"ranks", Num(world)}, {"bytes_per_rank", Num(double(work.bytes))}, {"layout", "\"" + layout + "\""},
               {"save_gib_s", Num(save)}, {"load_gib_s", Num(load)}, {"fio_write_gib_s", Num(fw)},
               {"fio_read_gib_s", Num(fr)}, {"save_vs_fio", Num(save / fw)}, {"load_vs_fio", Num(load / fr)},
               {"raw_write_gib_s", Num(rw)}, {"raw_read_gib_s", Num(rr)}, {"save_vs_raw", Num(save / rw)},
               {"load_vs_raw", Num(load / rr)}, {"save_vs_best", Num(save / std::max(fw, rw))},
               {"load_vs_best", Num(load / std::max(fr, rr))}, {"torch_save_gib_s", Num(ts)}, {"torch_save_s", Num(torch_s)},
               {"torch_bytes_written", Num(torch_written)}, {"save_bytes_written", Num(our_written)},
               {"save_vs_torch", Num(torch_s / save_s)}, {"many_small", Num(many_small)},
               {"save_s", Num(save_s)}, {"load_s", Num(Median(load_t))}};
    fields.insert(extra.begin(), extra.end());
    if (!with_torch) {
      for (const char* key : {"torch_save_gib_s", "torch_save_s", "torch_bytes_written", "save_vs_torch"}) fields.erase(key);
    }
    PrintJson(fields);
  }
  if (rank == 0) RemoveTree(dir).IgnoreError();
  return 0;
}
