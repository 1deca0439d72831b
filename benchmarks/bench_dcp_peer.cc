// bench_dcp_peer: shardckpt's side of benchmarks/bench_dcp.py, doing exactly what its PyTorch
// DCP worker (benchmarks/dcp_worker.py) does on the same tensors, so the two are compared on the
// same bytes, rank counts and folder:
//   save: T tensors [rows, 4096] float32, each rank holding its torch.chunk(dim 0) block
//         (DCP: DTensor Shard(0)); collective save with fsync and commit.
//   load: the same layout at this run's world size (same N: plain load; other M: resharded).
// Prints one JSON line from rank 0: {"mode", "seconds", "bytes"}; loads check every value.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {
// The worker computes the same: (global flat index + 7919 * tensor) % 65521, as float32.
float Value(int tensor, int64_t index) { return static_cast<float>((index + 7919 * tensor) % 65521); }
}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = CreateMpiCommunicator().value();
  po::options_description flags("bench_dcp_peer");
  flags.add_options()("mode", po::value<std::string>()->required(), "save | load")
      ("dir", po::value<std::string>()->required(), "checkpoint folder")
      ("rows", po::value<int64_t>()->required(), "rows of each [rows, 4096] tensor")
      ("tensors", po::value<int>()->default_value(8), "tensors")
      ("max-extent", po::value<std::string>()->default_value("8MiB"), "load: largest read")
      ("staging-buffers", po::value<size_t>()->default_value(8), "load: staging buffers (reads in flight)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  po::notify(vm);
  const std::string mode = vm["mode"].as<std::string>(), dir = vm["dir"].as<std::string>();
  const int tensors = vm["tensors"].as<int>();
  const Shape shape{vm["rows"].as<int64_t>(), 4096};
  const Layout block = ChunkLayout(shape, 0, comm->size(), comm->rank());
  const int64_t count = block.sizes[0] * shape[1], first = block.offsets[0] * shape[1];

  std::vector<std::vector<float>> data(tensors, std::vector<float>(static_cast<size_t>(count)));
  ShardedState state;
  for (int t = 0; t < tensors; ++t) {
    if (mode == "save") {
      for (int64_t i = 0; i < count; ++i) data[t][i] = Value(t, first + i);
    }
    Status added = state.AddTensor("layers." + std::to_string(t) + ".weight", DType::kFloat32, shape, block, data[t].data());
    if (!added.ok()) {
      std::fprintf(stderr, "bench_dcp_peer: %s\n", added.ToString().c_str());
      return 2;
    }
  }
  Status status;
  double seconds = TimeCollective(*comm, [&] {
    if (mode == "save") {
      status = Save(*comm, dir, 1, state).status();
    } else {
      LoadOptions options;
      options.plan.max_extent = ParseSize(vm["max-extent"].as<std::string>());
      options.staging_buffers = vm["staging-buffers"].as<size_t>();
      status = Load(*comm, dir, state, options).status();
    }
  });
  if (status.ok() && mode == "load") {
    for (int t = 0; t < tensors && status.ok(); ++t) {
      for (int64_t i = 0; i < count; ++i) {
        if (data[t][i] != Value(t, first + i)) {
          status = Internal("tensor " + std::to_string(t) + " element " + std::to_string(first + i) + " is wrong");
          break;
        }
      }
    }
  }
  status = AgreeOnStatus(*comm, status);
  if (!status.ok()) {
    if (comm->rank() == 0) std::fprintf(stderr, "bench_dcp_peer: %s\n", status.ToString().c_str());
    return 1;
  }
  if (comm->rank() == 0) {
    PrintJson({{"mode", "\"" + mode + "\""}, {"seconds", Num(seconds)},
               {"bytes", std::to_string(static_cast<uint64_t>(shape[0]) * shape[1] * 4 * tensors)}});
  }
  return 0;
}
