// bench_replicated_load: a model whose state is entirely replicated (DDP), loaded by every rank
// of one node (issue 14 part 4), against every rank reading the checkpoint's data files itself
// (sequential 8 MiB O_DIRECT preads of every file, as the load reads; on tmpfs that is the page
// cache), into one reused 8 MiB buffer and into memory the size of the files, all in one run.
// Four ways to load: read once and broadcast one entry per collective (as before batching), read
// once and broadcast in packed batches (the default from storage or across nodes), every rank
// reading (the default on one node from tmpfs), and the default itself.
//
//   mpirun -np 2 build/bin/bench_replicated_load --small 4000 --small-bytes 4096 --large 4 --large-bytes 64MiB --dir /dev/shm/b
//
// Medians of --iters runs; the last line is JSON.
#include <boost/program_options.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/io_engine.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

// Every data file of the checkpoint, whole, 8 MiB per pread; a short read fails. With `spread`
// false into the first 8 MiB of `buffer` again and again (the bytes land nowhere a model could
// use them, and stay in cache); with `spread` true one file after the other into `buffer`, as large
// as all the files: the memory a load's bytes must land in, the size of the state.
Status ReadEveryFile(const std::string& dir, const Manifest& manifest, AlignedBuffer* buffer, bool spread) {
  constexpr uint64_t kReadBytes = 8u << 20;
  uint64_t base = 0;
  for (const FileRecord& f : manifest.files) {
    const std::string path = JoinPath(dir, f.name);
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return ErrnoStatus(errno, "open " + path);
    for (uint64_t at = 0; at < f.size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kReadBytes, f.size - at));
      ssize_t got = ::pread(fd, buffer->data() + (spread ? base + at : 0), n, static_cast<off_t>(at));
      if (got <= 0) {
        ::close(fd);
        return got < 0 ? ErrnoStatus(errno, "pread " + path) : DataLoss("short read of " + path);
      }
      at += static_cast<uint64_t>(got);
    }
    ::close(fd);
    base += f.size;
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = CreateMpiCommunicator().value();
  po::options_description flags("bench_replicated_load");
  flags.add_options()("help", "this text")
      ("small", po::value<int>()->default_value(4000), "small replicated tensors")
      ("small-bytes", po::value<std::string>()->default_value("4096"), "bytes of each small tensor")
      ("large", po::value<int>()->default_value(4), "large replicated tensors")
      ("large-bytes", po::value<std::string>()->default_value("64MiB"), "bytes of each large tensor")
      ("dir", po::value<std::string>()->default_value("/dev/shm/shardckpt-bench-replicated"), "folder")
      ("iters", po::value<int>()->default_value(3), "repetitions (median reported)")
      ("memory-max-extent", po::value<std::string>()->default_value(std::to_string(ReadPlanOptions{}.memory_backed_max_extent)),
       "the loads' ReadPlanOptions::memory_backed_max_extent (0: 8 MiB reads from tmpfs too, as before 2026-12-02)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    if (comm->rank() == 0) std::cout << flags << "\n";
    return 0;
  }
  const int rank = comm->rank(), world = comm->size();
  const int small = vm["small"].as<int>(), large = vm["large"].as<int>();
  const uint64_t small_bytes = ParseSize(vm["small-bytes"].as<std::string>());
  const uint64_t large_bytes = ParseSize(vm["large-bytes"].as<std::string>());
  const std::string dir = vm["dir"].as<std::string>();
  const std::string memory_max_extent_text = vm["memory-max-extent"].as<std::string>();
  const uint64_t memory_max_extent = memory_max_extent_text == "0" ? 0 : ParseSize(memory_max_extent_text);
  const std::string root = JoinPath(dir, "root");
  std::vector<std::vector<unsigned char>> memory;
  auto build = [&](bool fill) {
    memory.clear();
    ShardedState state;
    for (int i = 0; i < small + large; ++i) {
      const uint64_t bytes = i < small ? small_bytes : large_bytes;
      memory.emplace_back(bytes, fill ? static_cast<unsigned char>(i * 7 + 1) : 0);
      CheckOrExit(state.AddTensor((i < small ? "small." : "large.") + std::to_string(i), DType::kUInt8,
                                  {static_cast<int64_t>(bytes)}, Layout::Whole(), memory.back().data()),
                  "tensor");
    }
    return state;
  };
  if (rank == 0) RemoveTree(dir).IgnoreError();
  comm->Barrier().IgnoreError();
  CheckOrExit(MakeDirs(dir), "folder");
  ShardedState saved_state = build(true);
  Result<SaveResult> saved = Save(*comm, root, 1, saved_state);
  CheckOrExit(saved.status(), "save");
  Result<Manifest> manifest = ReadManifest(saved->path);
  CheckOrExit(manifest.status(), "manifest");
  const std::vector<unsigned char> expected_first = memory[0], expected_last = memory.back();
  ShardedState targets = build(false);
  uint64_t file_bytes = 0;
  for (const FileRecord& f : manifest->files) file_bytes += f.size;
  AlignedBuffer read_buffer = AlignedBuffer::Allocate(file_bytes).value();
  std::vector<double> direct_t, spread_t, alone_t, batched_t, every_t, auto_t, unverified_t;
  std::vector<PhaseTime> auto_phases;  // rank 0's, of the last auto load: where its time went
  auto load = [&](ReplicatedReads mode, uint64_t batch, bool verify = true) {
    LoadOptions options;
    options.replicated_reads = mode;
    options.broadcast_batch_bytes = batch;
    options.verify_checksums = verify;
    options.plan.memory_backed_max_extent = memory_max_extent;
    Result<LoadReport> report = Internal("not run");
    double t = TimeCollective(*comm, [&] { report = Load(*comm, root, targets, options); });
    CheckOrExit(report.status(), "load");
    if (mode == ReplicatedReads::kAuto && verify) auto_phases = report->phases;
    if (memory[0] != expected_first || memory.back() != expected_last) CheckOrExit(Internal("loaded bytes differ"), "load");
    return t;
  };
  for (int it = 0; it < vm["iters"].as<int>(); ++it) {
    Status direct;
    direct_t.push_back(TimeCollective(*comm, [&] { direct = ReadEveryFile(saved->path, *manifest, &read_buffer, false); }));
    CheckOrExit(AgreeOnStatus(*comm, direct), "every rank reading the files");
    spread_t.push_back(TimeCollective(*comm, [&] { direct = ReadEveryFile(saved->path, *manifest, &read_buffer, true); }));
    CheckOrExit(AgreeOnStatus(*comm, direct), "every rank reading the files into state-sized memory");
    alone_t.push_back(load(ReplicatedReads::kBroadcast, 1));
    batched_t.push_back(load(ReplicatedReads::kBroadcast, 16u << 20));
    every_t.push_back(load(ReplicatedReads::kEveryRank, 16u << 20));
    auto_t.push_back(load(ReplicatedReads::kAuto, 16u << 20));
    unverified_t.push_back(load(ReplicatedReads::kAuto, 16u << 20, /*verify=*/false));
  }
  const double d = Median(direct_t), ds = Median(spread_t), a = Median(alone_t), b = Median(batched_t),
               e = Median(every_t), au = Median(auto_t), un = Median(unverified_t);
  if (rank == 0) {
    const double state_mib = (small * small_bytes + large * large_bytes) / 1048576.0;
    std::printf("bench_replicated_load: %d ranks, %d x %llu B + %d x %llu B replicated (%.0f MiB per rank) in %s\n", world,
                small, static_cast<unsigned long long>(small_bytes), large, static_cast<unsigned long long>(large_bytes),
                state_mib, dir.c_str());
    std::printf("  every rank reads the files itself: %.3fs (into one 8 MiB buffer; %.3fs into memory the size of the files, "
                "where a load's bytes land: the load's ratio to that is %.2fx with auto)\n", d, ds, ds / au);
    std::printf("  load, read once + one broadcast per entry (before): %.3fs = %.2fx of that\n", a, d / a);
    std::printf("  load, read once + batched broadcasts:               %.3fs = %.2fx\n", b, d / b);
    std::printf("  load, every rank reads:                             %.3fs = %.2fx\n", e, d / e);
    std::printf("  load, auto (%s here):                 %.3fs = %.2fx\n",
                IsMemoryBacked(JoinPath(saved->path, "manifest.json")) ? "every rank, tmpfs" : "broadcast, storage", au, d / au);
    // What checking every block's checksum costs here (loads verify by default).
    std::printf("  load, auto, checksums not verified:                 %.3fs = %.2fx (%.2fx of state-sized memory)\n", un,
                d / un, ds / un);
    std::printf("  rank 0's phases of the last auto load:");
    for (const PhaseTime& p : auto_phases) std::printf(" %s %.1f ms", p.name.c_str(), p.seconds * 1e3);
    std::printf("\n");
    PrintJson({{"ranks", Num(world)}, {"direct_s", Num(d)}, {"broadcast_each_s", Num(a)}, {"broadcast_batched_s", Num(b)},
               {"every_rank_s", Num(e)}, {"auto_s", Num(au)}, {"auto_vs_direct", Num(d / au)},
               {"broadcast_each_vs_direct", Num(d / a)},
               {"broadcast_batched_vs_direct", Num(d / b)}, {"every_rank_vs_direct", Num(d / e)},
               {"direct_state_sized_s", Num(ds)}, {"auto_vs_direct_state_sized", Num(ds / au)},
               {"auto_unverified_s", Num(un)}, {"auto_unverified_vs_direct_state_sized", Num(ds / un)}});
  }
  comm->Barrier().IgnoreError();
  if (rank == 0) RemoveTree(dir).IgnoreError();
  return 0;
}
