// bench_cuda: the device path on one GPU, against baselines measured in the same run:
//   * D2H staging: an async snapshot of device tensors (cudaMemcpyAsync into pinned staging on
//     shardckpt's stream) against one cudaMemcpy of the same device bytes into pinned memory;
//   * save from device memory (D2H through the pinned ring, overlapped with O_DIRECT writes)
//     against fio's write of the same bytes (bench_fio.h) and the old synchronous O_DIRECT loop;
//   * load into device memory (reads, verification, H2D) against fio's read and the old loop.
// Single process, no MPI. Exits 0 saying so when there is no device. Last line JSON.
//
//   build/bin/bench_cuda --bytes 4GiB --tensors 16 --dir /local/nvme/b
#include <cuda_runtime.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/device_memory.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {
void Check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}
void Check(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}
}  // namespace

int main(int argc, char** argv) {
  po::options_description flags("bench_cuda");
  flags.add_options()("help", "this text")
      ("bytes", po::value<std::string>()->default_value("2GiB"), "device bytes saved")
      ("tensors", po::value<int>()->default_value(16), "tensors")
      ("dir", po::value<std::string>()->default_value("/tmp/shardckpt-bench-cuda"), "folder")
      ("iters", po::value<int>()->default_value(3), "repetitions (median)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    std::cout << flags << "\n";
    return 0;
  }
  if (!CudaDevicePresent()) {
    std::printf("bench_cuda: no CUDA device here; nothing measured\n");
    PrintJson({{"device", "null"}});
    return 0;
  }
  const int tensors = vm["tensors"].as<int>(), iters = vm["iters"].as<int>();
  const std::string dir = vm["dir"].as<std::string>();
  const uint64_t per = ParseSize(vm["bytes"].as<std::string>()) / tensors / 4 * 4;
  const uint64_t total = per * tensors;
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::vector<void*> device(tensors);
  ShardedState state;
  for (int t = 0; t < tensors; ++t) {
    Check(cudaMalloc(&device[t], per), "cudaMalloc");
    Check(cudaMemset(device[t], t + 1, per), "cudaMemset");
    Check(state.AddDeviceTensor("t" + std::to_string(t), DType::kFloat32, {static_cast<int64_t>(per / 4)},
                                Layout::Whole(), device[t], 0),
          "AddDeviceTensor");
  }
  Check(MakeDirs(dir), "mkdir");
  Result<AlignedBuffer> pinned = AlignedBuffer::Allocate(total, StagingHostAllocator(true));
  Check(pinned.status(), "pinned allocation");
  auto comm = CreateSingleProcessCommunicator();
  auto saver = AsyncSaver::Create(*comm);
  Check(saver.status(), "AsyncSaver");

  std::vector<double> memcpy_s, snapshot_s, raw_write_s, save_s, raw_read_s, load_s;
  for (int i = 0; i < iters; ++i) {
    double t0 = NowSeconds();
    for (int t = 0; t < tensors; ++t) {
      Check(cudaMemcpy(pinned->data() + t * per, device[t], per, cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    memcpy_s.push_back(NowSeconds() - t0);

    RemoveTree(JoinPath(dir, "async")).IgnoreError();
    auto handle = (*saver)->Save(JoinPath(dir, "async"), 1, state);
    Check(handle.status(), "async save");
    snapshot_s.push_back((*saver)->last_snapshot_seconds());
    Check((*handle)->Wait(), "async persist");

    t0 = NowSeconds();
    Check(RawDirectWrite(JoinPath(dir, "raw.bin"), total), "raw write baseline");
    raw_write_s.push_back(NowSeconds() - t0);
    RemoveTree(JoinPath(dir, "sync")).IgnoreError();
    t0 = NowSeconds();
    Check(Save(*comm, JoinPath(dir, "sync"), 1, state).status(), "save");
    save_s.push_back(NowSeconds() - t0);

    t0 = NowSeconds();
    Check(RawDirectRead(JoinPath(dir, "raw.bin"), total), "raw read baseline");
    raw_read_s.push_back(NowSeconds() - t0);
    for (int t = 0; t < tensors; ++t) Check(cudaMemset(device[t], 0, per), "cudaMemset");
    t0 = NowSeconds();
    Check(Load(*comm, JoinPath(dir, "sync"), state).status(), "load");
    load_s.push_back(NowSeconds() - t0);
  }
  // The loaded bytes are the saved ones (each tensor was filled with t + 1).
  std::vector<unsigned char> probe(4096);
  for (int t = 0; t < tensors; ++t) {
    Check(cudaMemcpy(probe.data(), static_cast<char*>(device[t]) + per - 4096, 4096, cudaMemcpyDeviceToHost), "probe");
    if (std::count(probe.begin(), probe.end(), static_cast<unsigned char>(t + 1)) != 4096) {
      std::fprintf(stderr, "bench_cuda: tensor %d loaded wrong\n", t);
      return 1;
    }
  }
  // fio on the same file and bytes (bench_fio.h): the storage with 16 requests in flight.
  Result<FioRun> fio_w = RunFio({{"fio", JoinPath(dir, "raw.bin"), total, true}});
  Check(fio_w.status(), "fio write baseline");
  Result<FioRun> fio_r = RunFio({{"fio", JoinPath(dir, "raw.bin"), total, false}});
  Check(fio_r.status(), "fio read baseline");
  const double gib = static_cast<double>(total) / (1ull << 30);
  double m = Median(memcpy_s), s = Median(snapshot_s), w = Median(raw_write_s), sv = Median(save_s),
         r = Median(raw_read_s), l = Median(load_s);
  std::printf("%s, %.2f GiB in %d tensors, %s, medians of %d\n", prop.name, gib, tensors, dir.c_str(), iters);
  std::printf("D2H  cudaMemcpy to pinned %.2f GiB/s | async snapshot (D2H staging) %.2f GiB/s | staging/memcpy %.2f\n",
              gib / m, gib / s, m / s);
  std::printf("save raw O_DIRECT write %.2f GiB/s | save from device %.2f GiB/s | save/raw %.2f\n", gib / w, gib / sv, w / sv);
  std::printf("load raw O_DIRECT read %.2f GiB/s | load into device %.2f GiB/s | load/raw %.2f\n", gib / r, gib / l, r / l);
  const double fw = fio_w->GiBPerSecond(), fr = fio_r->GiBPerSecond();
  std::printf("%s: save/fio %.2f\n%s: load/fio %.2f\n", DescribeFio(*fio_w, "write").c_str(), gib / sv / fw,
              DescribeFio(*fio_r, "read").c_str(), gib / l / fr);
  PrintJson({{"device", "\"" + std::string(prop.name) + "\""}, {"bytes", std::to_string(total)},
             {"d2h_memcpy_gibps", Num(gib / m)}, {"d2h_staging_gibps", Num(gib / s)},
             {"staging_vs_memcpy", Num(m / s)}, {"save_gibps", Num(gib / sv)}, {"save_vs_raw", Num(w / sv)},
             {"load_gibps", Num(gib / l)}, {"load_vs_raw", Num(r / l)}, {"fio_write_gibps", Num(fw)},
             {"fio_read_gibps", Num(fr)}, {"save_vs_fio", Num(gib / sv / fw)}, {"load_vs_fio", Num(gib / l / fr)}});
  for (void* p : device) cudaFree(p);
  return 0;
}
