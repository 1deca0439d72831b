// bench_async_overlap: how long a training loop waits per checkpoint with async save (issue 14
// part 7), one rank. Three ways, in one run, on the same state:
//   * memcpy of the state's bytes into a buffer (the floor for any snapshot);
//   * AsyncSaver::Save: the loop blocks for the snapshot copy;
//   * AsyncSaver::StartSave, then a stand-in for the forward and backward passes of --step-ms
//     (a sleep: on a GPU job that time is spent on the device while the host CPU is free), then
//     Fence() before the "optimizer step": the loop blocks only for what of the copy is left.
//
//   build/bin/bench_async_overlap --bytes 1GiB --tensors 64 --step-ms 200 --dir /tmp/b
//
// Medians of --iters saves; the last line is JSON.
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description flags("bench_async_overlap");
  flags.add_options()("help", "this text")
      ("bytes", po::value<std::string>()->default_value("512MiB"), "state size")
      ("tensors", po::value<int>()->default_value(32), "tensors (equal sizes)")
      ("step-ms", po::value<int>()->default_value(200), "forward + backward time stood in for by a sleep")
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench-overlap"), "folder")
      ("iters", po::value<int>()->default_value(5), "saves per way (median reported)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    std::printf("%s\n", (std::ostringstream() << flags).str().c_str());
    return 0;
  }
  const int tensors = vm["tensors"].as<int>(), iters = vm["iters"].as<int>();
  const size_t each = ParseSize(vm["bytes"].as<std::string>()) / tensors;
  const auto step_time = std::chrono::milliseconds(vm["step-ms"].as<int>());
  const std::string dir = vm["dir"].as<std::string>();
  RemoveTree(dir).IgnoreError();
  CheckOrExit(MakeDirs(dir), "folder");
  std::vector<std::vector<unsigned char>> memory;
  ShardedState state;
  for (int i = 0; i < tensors; ++i) {
    memory.emplace_back(each, static_cast<unsigned char>(i + 1));
    CheckOrExit(state.AddTensor("t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(each)}, Layout::Whole(),
                                memory.back().data()),
                "tensor");
  }
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  SaveOptions options;
  options.keep_last = 2;
  auto saver = AsyncSaver::Create(*comm, options);
  CheckOrExit(saver.status(), "saver");
  AlignedBuffer copy = AlignedBuffer::Allocate(each * tensors + 4096).value();
  std::memset(copy.data(), 0, copy.size());
  std::vector<double> memcpy_t, blocking_t, fence_t, save_done_t;
  int64_t step = 0;
  // One unmeasured save of each kind first: staging is allocated and faulted in once.
  CheckOrExit((*saver)->Save(dir, step++, state).status(), "warm-up save");
  for (int it = 0; it < iters; ++it) {
    double start = NowSeconds();
    for (int i = 0; i < tensors; ++i) std::memcpy(copy.data() + i * each, memory[i].data(), each);
    memcpy_t.push_back(NowSeconds() - start);

    CheckOrExit((*saver)->Wait(), "persist");
    start = NowSeconds();
    CheckOrExit((*saver)->Save(dir, step++, state).status(), "save");
    blocking_t.push_back(NowSeconds() - start);
    std::this_thread::sleep_for(step_time);  // the step goes on; the tensors change after it

    CheckOrExit((*saver)->Wait(), "persist");
    start = NowSeconds();
    CheckOrExit((*saver)->StartSave(dir, step++, state).status(), "start save");
    double started = NowSeconds() - start;
    std::this_thread::sleep_for(step_time);  // forward + backward: the tensors are only read
    start = NowSeconds();
    CheckOrExit((*saver)->Fence(), "fence");
    fence_t.push_back(started + NowSeconds() - start);
  }
  CheckOrExit((*saver)->Wait(), "persist");
  RemoveTree(dir).IgnoreError();
  const double m = Median(memcpy_t), b = Median(blocking_t), f = Median(fence_t);
  const double step_s = vm["step-ms"].as<int>() / 1000.0;
  std::printf("bench_async_overlap: %d tensors x %zu bytes (%.0f MiB), step %.0f ms, into %s\n", tensors, each,
              double(each) * tensors / 1048576, step_s * 1000, dir.c_str());
  std::printf("  memcpy of the state %.3fs; Save blocks %.3fs (%.2fx memcpy); StartSave + Fence block %.4fs (%.2fx "
              "memcpy, %.1f%% of the step)\n",
              m, b, b / m, f, f / m, 100 * f / step_s);
  PrintJson({{"memcpy_s", Num(m)}, {"save_blocking_s", Num(b)}, {"fence_blocking_s", Num(f)},
             {"save_blocking_vs_memcpy", Num(b / m)}, {"fence_vs_memcpy", Num(f / m)}, {"fence_vs_step", Num(f / step_s)}});
  return 0;
}
