// bench_consolidate: streaming consolidation of a sharded checkpoint into one .pt (or
// .safetensors) against copies of the same bytes that overlap reading and writing, in one run on
// one folder, with the consolidating process's peak resident memory. Two such baselines run and
// the stronger (faster) one is the ratio's denominator: fio reading every rank file and writing
// one output file at once (bench_fio.h: io_uring, O_DIRECT, 8 MiB, QD16, end_fsync), and
// `cp --reflink=never` of the rank files plus `sync` of the copies (page cache dropped first).
// The old baseline, O_DIRECT read of everything then write of everything, is printed too.
//
//   build/bin/bench_consolidate --total-bytes 4GiB --save-ranks 4 --format torch --dir /tmp/b
//
// The consolidation runs in a child process, so its peak RSS (from wait4) is its own and not
// the checkpoint writer's. Last line JSON.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "benchmarks/bench_process.h"
#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description flags("bench_consolidate");
  flags.add_options()("help", "this text")
      ("total-bytes", po::value<std::string>()->default_value("1GiB"), "checkpoint size")
      ("save-ranks", po::value<int>()->default_value(4), "ranks (files) of the checkpoint")
      ("format", po::value<std::string>()->default_value("torch"), "torch | safetensors")
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench-consolidate"), "folder")
      ("keep", "keep the consolidated file (e.g. to check it with torch.load and unzip -t)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    std::cout << flags << "\n";
    return 0;
  }
  const std::string dir = vm["dir"].as<std::string>();
  const uint64_t total = ParseSize(vm["total-bytes"].as<std::string>());
  const int n = vm["save-ranks"].as<int>();
  const bool torch = vm["format"].as<std::string>() == "torch";
  RemoveTree(dir).IgnoreError();
  MakeDirs(dir).IgnoreError();
  const Shape shape = {8192, 4096};  // 128 MiB float32 tensors
  const int tensors = std::max<int>(1, static_cast<int>(total / (8192ull * 4096 * 4)));
  {
    auto out = OfflineCheckpointWriter::Begin(JoinPath(dir, "ckpt"), 1, n).value();
    for (int t = 0; t < tensors; ++t) {
      for (int r = 0; r < n; ++r) {
        Layout l = FlatShardLayout(shape, n, r);
        std::vector<float> piece(static_cast<size_t>(l.end - l.begin), static_cast<float>(t));
        out->AddPiece(r, "layer." + std::to_string(t) + ".weight", DType::kFloat32, shape, l, piece.data(), piece.size() * 4)
            .IgnoreError();
      }
    }
    if (!out->Commit(MakeCreationInfo(1, "", "", {})).ok()) return 1;
  }
  const double bytes = static_cast<double>(tensors) * 8192 * 4096 * 4;
  const std::string output = JoinPath(dir, torch ? "model.pt" : "model.safetensors");

  const std::string step = JoinPath(dir, "ckpt/step-000000001");
  std::vector<std::string> files;
  for (const std::string& name : ListDir(step).value()) {
    if (name.rfind("rank-", 0) == 0) files.push_back(JoinPath(step, name));
  }
  auto drop_cache = [&] {
    for (const std::string& f : files) CheckOrExit(DropCache(f), "dropping the page cache");
  };

  drop_cache();
  double t0 = NowSeconds();
  pid_t child = fork();
  if (child == 0) {
    ConsolidateOptions options;
    options.format = torch ? ExportFormat::kTorch : ExportFormat::kSafetensors;
    Result<ConsolidateReport> r = Consolidate(JoinPath(dir, "ckpt"), output, options);
    if (!r.ok()) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    _exit(r.ok() ? 0 : 1);
  }
  int status = 0;
  struct rusage usage {};
  wait4(child, &status, 0, &usage);
  double consolidate_s = NowSeconds() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  double rss_mib = usage.ru_maxrss / 1024.0;

  // fio: every rank file read and the output written, all jobs at once.
  std::vector<FioJob> jobs;
  for (size_t i = 0; i < files.size(); ++i) {
    jobs.push_back({"read" + std::to_string(i), files[i], FileSize(files[i]).value(), false});
  }
  jobs.push_back({"write", JoinPath(dir, "fio-out"), static_cast<uint64_t>(bytes), true});
  Result<FioRun> fio = RunFio(jobs);
  CheckOrExit(fio.status(), "fio read+write baseline");
  const FioRun& f = *fio;
  double fio_out_bytes = static_cast<double>(f.jobs.back().io_bytes), fio_in_bytes = double(f.bytes) - fio_out_bytes;
  ::unlink(JoinPath(dir, "fio-out").c_str());

  // cp: the same rank files copied (buffered, so reading and writing overlap) and synced.
  const std::string cp_dir = JoinPath(dir, "cp-out");
  CheckOrExit(MakeDirs(cp_dir), "cp baseline");
  drop_cache();
  std::vector<std::string> cp = {"cp", "--reflink=never"}, sync = {"sync"};
  cp.insert(cp.end(), files.begin(), files.end());
  cp.push_back(cp_dir);
  for (const std::string& file : files) sync.push_back(JoinPath(cp_dir, BaseName(file)));
  t0 = NowSeconds();
  CheckOrExit(RunCapture(cp).status(), "cp baseline");
  CheckOrExit(RunCapture(sync).status(), "cp baseline's sync");
  double cp_s = NowSeconds() - t0;
  RemoveTree(cp_dir).IgnoreError();

  // The old baseline: read everything, then write everything, one 8 MiB request at a time.
  t0 = NowSeconds();
  for (const std::string& file : files) CheckOrExit(RawDirectRead(file, FileSize(file).value() / 4096 * 4096), "raw read");
  CheckOrExit(RawDirectWrite(JoinPath(dir, "raw-out"), static_cast<uint64_t>(bytes)), "raw write");
  double raw_s = NowSeconds() - t0;

  // Each baseline's rate is the checkpoint's bytes over its time; fio's, the bytes its write job
  // wrote over its longest job's runtime.
  double gib = GiBPerSecond(bytes, consolidate_s), raw = GiBPerSecond(bytes, raw_s), cp_rate = GiBPerSecond(bytes, cp_s);
  double fio_rate = GiBPerSecond(fio_out_bytes, f.seconds);
  const bool fio_stronger = fio_rate >= cp_rate;
  const double best = fio_stronger ? fio_rate : cp_rate;
  std::printf("bench_consolidate: %.2f GiB in %d tensors from %d rank files to %s\n", bytes / (1 << 30), tensors, n,
              output.c_str());
  std::printf("  fio read+write at once %.3f GiB/s (%.0f MiB read by %zu jobs while one job wrote %.0f MiB, %.2fs, %s)\n",
              fio_rate, fio_in_bytes / 1048576, files.size(), fio_out_bytes / 1048576, f.seconds,
              f.direct ? "O_DIRECT" : "buffered");
  std::printf("  cp --reflink=never + sync %.3f GiB/s (%.2fs); old read-then-write %.3f GiB/s (%.2fs)\n", cp_rate, cp_s,
              raw, raw_s);
  std::printf("  consolidate %.3f GiB/s (%.2fs): %.2fx the stronger baseline (%s), %.2fx the old one; peak RSS %.0f MiB\n",
              gib, consolidate_s, gib / best, fio_stronger ? "fio" : "cp", gib / raw, rss_mib);
  PrintJson({{"bytes", Num(bytes)}, {"format", torch ? "\"torch\"" : "\"safetensors\""}, {"consolidate_gib_s", Num(gib)},
             {"fio_read_write_gib_s", Num(fio_rate)}, {"cp_gib_s", Num(cp_rate)},
             {"baseline", fio_stronger ? "\"fio\"" : "\"cp\""}, {"consolidate_vs_baseline", Num(gib / best)},
             {"raw_read_write_gib_s", Num(raw)}, {"consolidate_vs_raw", Num(gib / raw)}, {"peak_rss_mib", Num(rss_mib)}});
  if (vm.count("keep")) {
    RemoveTree(JoinPath(dir, "ckpt")).IgnoreError();
    ::unlink(JoinPath(dir, "raw-out").c_str());
  } else {
    RemoveTree(dir).IgnoreError();
  }
  return 0;
}
