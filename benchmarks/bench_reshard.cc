// bench_reshard: loading a checkpoint saved by N ranks (FSDP flat shards) into M ranks as dim-0
// or dim-1 blocks, against a same-layout load at M, fio's read of the same bytes (bench_fio.h:
// io_uring, O_DIRECT, 8 MiB, QD16, one job per rank) and the old one-request-at-a-time O_DIRECT
// read, in one run on one folder. The N-rank checkpoint is written by rank 0 with the offline writer
// (what `shardckpt reshard`/`import` use), so N and M are independent of mpirun's -np.
//
//   mpirun -np 3 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim1 --dir /tmp/b
//
// Throughput = bytes loaded by all ranks / wall time between barriers. Read amplification =
// bytes read from data files (all ranks) / bytes wanted. Last line JSON.
#include <boost/program_options.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

float Value(int tensor, int64_t index) { return static_cast<float>(tensor * 1000003 + index % 999983); }

void Fill(std::vector<float>& out, int tensor, const Shape& shape, const Layout& layout) {
  std::vector<Region> whole = LayoutRegions(Layout::Whole(), shape);
  for (const Region& r : LayoutRegions(layout, shape)) {
    ForEachCopy(whole[0], r, [&](int64_t g, int64_t l, int64_t n) {
      for (int64_t i = 0; i < n; ++i) out[l + i] = Value(tensor, g + i);
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = CreateMpiCommunicator().value();
  po::options_description flags("bench_reshard");
  flags.add_options()("help", "this text")
      ("save-ranks", po::value<int>()->default_value(8), "N: ranks (files) of the saved checkpoint")
      ("total-bytes", po::value<std::string>()->default_value("512MiB"), "checkpoint size")
      ("tensors", po::value<int>()->default_value(8), "tensors, each [rows, 4096] float32")
      ("wanted", po::value<std::string>()->default_value("dim0"), "dim0 (row blocks) | dim1 (column blocks)")
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench-reshard"), "folder")
      ("iters", po::value<int>()->default_value(3), "repetitions (median)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    if (comm->rank() == 0) std::cout << flags << "\n";
    return 0;
  }
  const int rank = comm->rank(), world = comm->size(), n = vm["save-ranks"].as<int>(), tensors = vm["tensors"].as<int>();
  const std::string dir = vm["dir"].as<std::string>(), wanted_kind = vm["wanted"].as<std::string>();
  const int iters = vm["iters"].as<int>();
  const int64_t cols = 4096;
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(ParseSize(vm["total-bytes"].as<std::string>()) / tensors / (cols * 4)));
  const Shape shape = {rows, cols};
  const std::string saved = JoinPath(dir, "saved-n"), same = JoinPath(dir, "same-m");

  // The N-rank checkpoint, written once by rank 0.
  Status prepared;
  if (rank == 0) {
    RemoveTree(dir).IgnoreError();
    prepared = MakeDirs(dir);
    Result<std::unique_ptr<OfflineCheckpointWriter>> out = OfflineCheckpointWriter::Begin(saved, 1, n);
    if (prepared.ok()) prepared = out.status();
    for (int t = 0; t < tensors && prepared.ok(); ++t) {
      for (int r = 0; r < n && prepared.ok(); ++r) {
        Layout l = FlatShardLayout(shape, n, r);
        std::vector<float> piece(static_cast<size_t>(l.end - l.begin));
        Fill(piece, t, shape, l);
        prepared = (*out)->AddPiece(r, "layer." + std::to_string(t) + ".weight", DType::kFloat32, shape, l, piece.data(),
                                    piece.size() * 4);
      }
    }
    if (prepared.ok()) prepared = (*out)->Commit(MakeCreationInfo(1, "", "", {})).status();
  }
  if (!BroadcastStatus(*comm, prepared, 0).ok()) {
    std::fprintf(stderr, "rank %d: preparing failed: %s\n", rank, prepared.ToString().c_str());
    return 1;
  }

  auto wanted_layout = [&](int r) {
    return wanted_kind == "dim1" ? ChunkLayout(shape, 1, world, r) : ChunkLayout(shape, 0, world, r);
  };
  std::vector<std::vector<float>> mine(tensors);
  ShardedState targets;
  for (int t = 0; t < tensors; ++t) {
    Layout l = wanted_layout(rank);
    mine[t].assign(static_cast<size_t>(NumElements(LocalShape(l, shape)).value()), -1.0f);
    targets.AddTensor("layer." + std::to_string(t) + ".weight", DType::kFloat32, shape, l, mine[t].data()).IgnoreError();
  }
  double total_bytes = 0;
  for (auto& v : mine) total_bytes += v.size() * 4.0;
  comm->AllReduceSumDouble(&total_bytes, 1).IgnoreError();

  std::vector<double> reshard_t, same_t, raw_t;
  double read_bytes = 0, wanted_bytes = 0;
  // Same layout at M: save flat at M once, then load flat.
  std::vector<std::vector<float>> flat(tensors);
  ShardedState flat_state;
  for (int t = 0; t < tensors; ++t) {
    Layout l = FlatShardLayout(shape, world, rank);
    flat[t].resize(static_cast<size_t>(l.end - l.begin));
    Fill(flat[t], t, shape, l);
    flat_state.AddTensor("layer." + std::to_string(t) + ".weight", DType::kFloat32, shape, l, flat[t].data()).IgnoreError();
  }
  if (!Save(*comm, same, 1, flat_state).ok()) return 1;
  const std::string raw = JoinPath(dir, "raw-" + std::to_string(rank));  // fio's file too
  uint64_t raw_bytes = FioBytes(static_cast<uint64_t>(total_bytes / world));  // whole fio blocks
  FioForRanks(*comm, dir, "raw-", raw_bytes, /*write=*/true);
  std::vector<double> fio_r;
  for (int it = 0; it < iters; ++it) {
    Result<LoadReport> report = Internal("not run");
    reshard_t.push_back(TimeCollective(*comm, [&] { report = Load(*comm, saved, targets); }));
    if (!report.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, report.status().ToString().c_str());
      return 1;
    }
    read_bytes = static_cast<double>(report->stats.data_bytes_read + report->stats.table_bytes_read);
    wanted_bytes = static_cast<double>(report->bytes_wanted);
    same_t.push_back(TimeCollective(*comm, [&] { Load(*comm, same, flat_state).status().IgnoreError(); }));
    Status raw_read;
    raw_t.push_back(TimeCollective(*comm, [&] { raw_read = RawDirectRead(raw, raw_bytes); }));
    CheckOrExit(AgreeOnStatus(*comm, raw_read), "raw read baseline");
    FioRun fr = FioForRanks(*comm, dir, "raw-", raw_bytes, /*write=*/false);
    fio_r.push_back(fr.GiBPerSecond());
    if (rank == 0 && it == 0) std::printf("  %s\n", DescribeFio(fr, "read").c_str());
  }
  // Spot-check the resharded values against the generator.
  for (int t = 0; t < tensors; ++t) {
    std::vector<float> expected(mine[t].size());
    Fill(expected, t, shape, wanted_layout(rank));
    if (expected != mine[t]) {
      std::fprintf(stderr, "rank %d: resharded tensor %d differs\n", rank, t);
      return 1;
    }
  }
  comm->AllReduceSumDouble(&read_bytes, 1).IgnoreError();
  comm->AllReduceSumDouble(&wanted_bytes, 1).IgnoreError();
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double reshard = GiBPerSecond(total_bytes, median(reshard_t)), same_layout = GiBPerSecond(total_bytes, median(same_t));
  double raw_read = GiBPerSecond(double(raw_bytes) * world, median(raw_t)), fio_read = median(fio_r);
  if (rank == 0) {
    std::printf("bench_reshard: %.0f MiB in %d tensors [%lld, %lld] float32, saved flat by %d ranks, loaded as %s blocks by %d\n",
                total_bytes / 1048576, tensors, static_cast<long long>(rows), static_cast<long long>(cols), n,
                wanted_kind.c_str(), world);
    std::printf("  resharded load %.3f GiB/s, same-layout load %.3f GiB/s, fio read %.3f GiB/s, old sync raw read %.3f GiB/s\n",
                reshard, same_layout, fio_read, raw_read);
    std::printf("  reshard/fio %.2f, same-layout/fio %.2f, reshard/old raw %.2f, reshard/same-layout %.2f, read amplification"
                " %.4f (checksum tables included)\n",
                reshard / fio_read, same_layout / fio_read, reshard / raw_read, reshard / same_layout,
                read_bytes / wanted_bytes);
    PrintJson({{"save_ranks", Num(n)}, {"load_ranks", Num(world)}, {"wanted", "\"" + wanted_kind + "\""},
               {"reshard_load_gib_s", Num(reshard)}, {"same_layout_load_gib_s", Num(same_layout)},
               {"fio_read_gib_s", Num(fio_read)}, {"reshard_vs_fio", Num(reshard / fio_read)},
               {"same_layout_vs_fio", Num(same_layout / fio_read)},
               {"reshard_vs_best", Num(reshard / std::max(fio_read, raw_read))},
               {"raw_read_gib_s", Num(raw_read)}, {"reshard_vs_raw", Num(reshard / raw_read)},
               {"read_amplification", Num(read_bytes / wanted_bytes)}});
    RemoveTree(dir).IgnoreError();
  }
  return 0;
}
