// bench_save_load: sharded save and same-layout load against the raw O_DIRECT write and read of
// the same bytes per rank, and against per-rank torch.save-style serialization (libtorch pickle
// + zip, written and fsynced), all in one run on the same folder.
//
//   mpirun -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout flat --dir /tmp/b
//
// Throughputs are total bytes over all ranks / wall time between barriers; each figure is the
// median of --iters runs. The last line is JSON.
#include <torch/torch.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <cstdio>
#include <fstream>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/torch/torch_adapter.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Per-rank tensors of `layout` whose local sizes add up to about bytes_per_rank.
struct Workload {
  std::vector<at::Tensor> local;
  std::vector<Shape> global;
  std::vector<Layout> layouts;
  uint64_t bytes = 0;
};

// Replicas must hold equal values on every rank (the save writes one of them), so the values
// come from a generator seeded the same everywhere; load targets start zeroed.
Workload MakeWorkload(uint64_t bytes_per_rank, int tensors, const std::string& layout, int world, int rank, bool zeroed) {
  Workload w;
  at::manual_seed(1234 + (layout == "replicated" ? 0 : rank));
  const int64_t cols = 1024;
  int64_t local_rows = std::max<int64_t>(1, static_cast<int64_t>(bytes_per_rank / tensors / (cols * 4)));
  for (int t = 0; t < tensors; ++t) {
    Shape global = layout == "replicated" ? Shape{local_rows, cols} : Shape{local_rows * world, cols};
    Layout l = layout == "flat" ? FlatShardLayout(global, world, rank)
               : layout == "dim0" ? ChunkLayout(global, 0, world, rank)
                                  : Layout::Replicated();
    Shape local_shape = LocalShape(l, global);
    std::vector<int64_t> sizes(local_shape.begin(), local_shape.end());
    at::Tensor tensor = zeroed ? at::zeros(sizes) : at::rand(sizes);
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
    AddTensor(state, "layer." + std::to_string(t) + ".weight", w.local[t], w.layouts[t], w.global[t]).IgnoreError();
  }
  return state;
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
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench"), "folder to write in")
      ("iters", po::value<int>()->default_value(3), "repetitions (median reported)")
      ("async", "also measure async save (see issue 6)");
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
  const int rank = comm->rank(), world = comm->size();
  if (rank == 0) {
    RemoveTree(dir).IgnoreError();
    MakeDirs(dir).IgnoreError();
  }
  comm->Barrier().IgnoreError();

  Workload work = MakeWorkload(bytes_per_rank, vm["tensors"].as<int>(), layout, world, rank, false);
  double total_bytes = static_cast<double>(work.bytes);
  comm->AllReduceSumDouble(&total_bytes, 1).IgnoreError();
  if (layout == "replicated") total_bytes = static_cast<double>(work.bytes);  // one copy is the checkpoint
  ShardedState state = StateOf(work);
  const std::string raw_path = JoinPath(dir, "raw-" + std::to_string(rank) + ".bin");
  // Replicated state is written once in total, so its raw baseline is the bytes each rank writes.
  uint64_t raw_bytes = layout == "replicated" ? work.bytes / world : work.bytes;
  double raw_total = static_cast<double>(raw_bytes) * world;

  std::vector<double> raw_w, raw_r, save_t, load_t, torch_t;
  for (int it = 0; it < iters; ++it) {
    raw_w.push_back(TimeCollective(*comm, [&] { RawDirectWrite(raw_path, raw_bytes); }));
    raw_r.push_back(TimeCollective(*comm, [&] { RawDirectRead(raw_path, raw_bytes); }));
    const std::string root = JoinPath(dir, "ckpt");
    SaveOptions save_options;
    save_options.keep_last = 1;
    Status saved;
    save_t.push_back(TimeCollective(*comm, [&] { saved = Save(*comm, root, it + 1, state, save_options).status(); }));
    if (!saved.ok()) {  // Save returns the same Status on every rank
      std::fprintf(stderr, "rank %d: save failed: %s\n", rank, saved.ToString().c_str());
      return 1;
    }
    Workload into = MakeWorkload(bytes_per_rank, vm["tensors"].as<int>(), layout, world, rank, true);
    ShardedState targets = StateOf(into);
    Status loaded;
    load_t.push_back(TimeCollective(*comm, [&] { loaded = Load(*comm, root, targets).status(); }));
    bool equal = loaded.ok();
    for (size_t t = 0; equal && t < work.local.size(); ++t) equal = into.local[t].equal(work.local[t]);
    // Every rank learns of a failure on any rank, so none is left waiting in a barrier.
    Status verdict = AgreeOnStatus(*comm, equal ? Status::Ok() : DataLoss("loaded tensors differ: " + loaded.ToString()));
    if (!verdict.ok()) {
      std::fprintf(stderr, "rank %d: load check failed: %s\n", rank, verdict.ToString().c_str());
      return 1;
    }
    torch_t.push_back(TimeCollective(*comm, [&] {
      c10::List<at::Tensor> list;
      for (auto& t : work.local) list.push_back(t);
      std::vector<char> bytes = torch::pickle_save(c10::IValue(list));
      std::string path = JoinPath(dir, "torch-" + std::to_string(rank) + ".pt");
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      size_t done = 0;
      while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::fsync(fd);
      ::close(fd);
    }));
  }
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
  double rw = GiBPerSecond(raw_total, Median(raw_w)), rr = GiBPerSecond(raw_total, Median(raw_r));
  double ts = GiBPerSecond(total_bytes, Median(torch_t));
  if (rank == 0) {
    std::printf("bench_save_load: %d ranks, %.1f MiB per rank, %s layout, %d iters, dir %s\n", world,
                work.bytes / 1048576.0, layout.c_str(), iters, dir.c_str());
    std::printf("  raw O_DIRECT write %.3f GiB/s, read %.3f GiB/s\n", rw, rr);
    std::printf("  shardckpt save %.3f GiB/s (%.2fx raw), load %.3f GiB/s (%.2fx raw)\n", save, save / rw, load, load / rr);
    std::printf("  torch pickle_save+fsync %.3f GiB/s (shardckpt save %.2fx)\n", ts, save / ts);
    std::map<std::string, std::string> extra;
    if (!async_t.empty()) {
      double block = Median(async_t), copy = Median(memcpy_t), sync = Median(save_t);
      std::printf("  async save blocks %.4fs: %.2fx a memcpy of the same bytes (%.4fs), %.1f%% of a sync save (%.3fs)\n",
                  block, block / copy, copy, 100 * block / sync, sync);
      extra = {{"async_block_s", Num(block)}, {"memcpy_s", Num(copy)}, {"async_block_vs_memcpy", Num(block / copy)},
               {"async_block_vs_sync", Num(block / sync)}};
    }
    std::map<std::string, std::string> fields = {{"ranks", Num(world)}, {"bytes_per_rank", Num(double(work.bytes))}, {"layout", "\"" + layout + "\""},
               {"save_gib_s", Num(save)}, {"load_gib_s", Num(load)}, {"raw_write_gib_s", Num(rw)},
               {"raw_read_gib_s", Num(rr)}, {"torch_save_gib_s", Num(ts)}, {"save_vs_raw", Num(save / rw)},
               {"load_vs_raw", Num(load / rr)}, {"save_vs_torch", Num(save / ts)}};
    fields.insert(extra.begin(), extra.end());
    PrintJson(fields);
  }
  if (rank == 0) RemoveTree(dir).IgnoreError();
  return 0;
}
