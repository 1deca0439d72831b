// bench_consolidate: streaming consolidation of a sharded checkpoint into one .pt (or
// .safetensors) against a raw O_DIRECT read plus a sequential write of the same bytes, in one
// run on one folder, with the consolidating process's peak resident memory.
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

  // Baseline: read the same bytes with O_DIRECT and write them sequentially.
  std::vector<std::string> files;
  for (const std::string& name : ListDir(JoinPath(dir, "ckpt/step-000000001")).value()) {
    if (name.rfind("rank-", 0) == 0) files.push_back(JoinPath(dir, "ckpt/step-000000001/" + name));
  }
  t0 = NowSeconds();
  for (const std::string& f : files) RawDirectRead(f, FileSize(f).value() / 4096 * 4096);
  RawDirectWrite(JoinPath(dir, "raw-out"), static_cast<uint64_t>(bytes));
  double raw_s = NowSeconds() - t0;
  double gib = GiBPerSecond(bytes, consolidate_s), raw = GiBPerSecond(bytes, raw_s);
  std::printf("bench_consolidate: %.2f GiB in %d tensors from %d rank files to %s\n", bytes / (1 << 30), tensors, n,
              output.c_str());
  std::printf("  consolidate %.3f GiB/s (%.1fs), raw read+write %.3f GiB/s (%.1fs): ratio %.2f; peak RSS %.0f MiB\n", gib,
              consolidate_s, raw, raw_s, gib / raw, rss_mib);
  PrintJson({{"bytes", Num(bytes)}, {"format", torch ? "\"torch\"" : "\"safetensors\""}, {"consolidate_gib_s", Num(gib)},
             {"raw_read_write_gib_s", Num(raw)}, {"consolidate_vs_raw", Num(gib / raw)}, {"peak_rss_mib", Num(rss_mib)}});
  if (vm.count("keep")) {
    RemoveTree(JoinPath(dir, "ckpt")).IgnoreError();
    ::unlink(JoinPath(dir, "raw-out").c_str());
  } else {
    RemoveTree(dir).IgnoreError();
  }
  return 0;
}
