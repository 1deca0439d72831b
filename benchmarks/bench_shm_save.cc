// bench_shm_save: a one-rank save into a memory-backed folder (/dev/shm) against a plain
// single-copy write of the same bytes into the same folder, measured alternately in one run
// (issue 14 part 3). The plain write is what a save cannot beat on tmpfs: one pwrite per 8 MiB
// straight from the tensors' memory (the kernel's copy into the page cache is the only pass over
// the bytes), then fdatasync. The save adds the checksums (XXH3 per 4096-byte block), the
// checksum table, the manifest and the commit renames.
//
//   build/bin/bench_shm_save --bytes 1GiB --tensors 64 --dir /dev/shm/b [--unaligned] [--stage]
//
// --unaligned puts every tensor 64 bytes off a page, so the save must copy it through its staging
// ring (the copy-and-hash path); --stage forces that path for aligned tensors too (as
// SaveOptions::always_stage). The median of --iters runs; the last line is JSON.
#include <boost/program_options.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

namespace {

// CPU seconds of the whole process (io_uring's workers are its threads): on a machine shared
// with other work the CPU time per byte moves far less than the wall time.
double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The plain write: every tensor in turn, 8 MiB per pwrite, then fdatasync. A short write fails.
Status PlainWrite(const std::string& path, const std::vector<const unsigned char*>& tensors, size_t bytes_each) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  uint64_t at = 0;
  for (const unsigned char* t : tensors) {
    for (size_t done = 0; done < bytes_each;) {
      size_t n = std::min<size_t>(8u << 20, bytes_each - done);
      ssize_t w = ::pwrite(fd, t + done, n, static_cast<off_t>(at));
      if (w <= 0) {
        ::close(fd);
        return w < 0 ? ErrnoStatus(errno, "pwrite " + path) : DataLoss("short write to " + path);
      }
      done += static_cast<size_t>(w);
      at += static_cast<uint64_t>(w);
    }
  }
  int synced = ::fdatasync(fd);
  ::close(fd);
  return synced == 0 ? Status::Ok() : ErrnoStatus(errno, "fdatasync " + path);
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description flags("bench_shm_save");
  flags.add_options()("help", "this text")
      ("bytes", po::value<std::string>()->default_value("1GiB"), "state size")
      ("tensors", po::value<int>()->default_value(64), "tensors (equal sizes)")
      ("dir", po::value<std::string>()->default_value("/dev/shm/shardckpt-bench-shm"), "memory-backed folder")
      ("iters", po::value<int>()->default_value(5), "alternating repetitions (median reported)")
      ("unaligned", "tensors 64 bytes off a page: the save stages (copies) them")
      ("stage", "always stage (SaveOptions::always_stage)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    std::printf("%s\n", (std::ostringstream() << flags).str().c_str());
    return 0;
  }
  const int tensors = vm["tensors"].as<int>();
  const size_t each = AlignDown(ParseSize(vm["bytes"].as<std::string>()) / tensors, 64);
  const bool unaligned = vm.count("unaligned") > 0;
  const std::string dir = vm["dir"].as<std::string>();
  CheckOrExit(MakeDirs(dir), "folder");
  std::vector<AlignedBuffer> memory;
  std::vector<const unsigned char*> data;
  ShardedState state;
  std::mt19937_64 random(7);
  for (int i = 0; i < tensors; ++i) {
    Result<AlignedBuffer> buffer = AlignedBuffer::Allocate(each + 4096);
    CheckOrExit(buffer.status(), "allocation");
    auto* words = reinterpret_cast<uint64_t*>(buffer->data());
    for (size_t w = 0; w < (each + 4096) / 8; ++w) words[w] = random();
    unsigned char* at = buffer->data() + (unaligned ? 64 : 0);
    CheckOrExit(state.AddTensor("t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(each)}, Layout::Whole(), at),
                "tensor");
    data.push_back(at);
    memory.push_back(std::move(buffer).value());
  }
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  SaveOptions options;
  options.always_stage = vm.count("stage") > 0;
  const double total = static_cast<double>(each) * tensors;
  std::vector<double> plain_t, save_t, plain_cpu, save_cpu;
  const std::string plain_path = JoinPath(dir, "plain.bin");
  for (int it = 0; it < vm["iters"].as<int>(); ++it) {
    RemoveTree(plain_path).IgnoreError();
    double start = NowSeconds(), cpu = CpuSeconds();
    CheckOrExit(PlainWrite(plain_path, data, each), "plain write");
    plain_t.push_back(NowSeconds() - start);
    plain_cpu.push_back(CpuSeconds() - cpu);
    RemoveTree(plain_path).IgnoreError();
    RemoveTree(JoinPath(dir, "root")).IgnoreError();  // freeing tmpfs pages is timed in neither
    start = NowSeconds();
    cpu = CpuSeconds();
    CheckOrExit(Save(*comm, JoinPath(dir, "root"), it, state, options).status(), "save");
    save_t.push_back(NowSeconds() - start);
    save_cpu.push_back(CpuSeconds() - cpu);
  }
  RemoveTree(dir).IgnoreError();
  const double plain = GiBPerSecond(total, Median(plain_t)), save = GiBPerSecond(total, Median(save_t));
  std::printf("bench_shm_save: %d tensors x %zu bytes (%.0f MiB) into %s, %s%s\n", tensors, each, total / 1048576,
              dir.c_str(), unaligned ? "unaligned (staged)" : "page-aligned", options.always_stage ? ", always staged" : "");
  const double best_plain = GiBPerSecond(total, *std::min_element(plain_t.begin(), plain_t.end()));
  const double best_save = GiBPerSecond(total, *std::min_element(save_t.begin(), save_t.end()));
  const double cpu_plain = Median(plain_cpu), cpu_save = Median(save_cpu);
  std::printf("  plain single-copy write %.3f GiB/s, shardckpt save %.3f GiB/s: %.2fx the plain write (medians of %d)\n",
              plain, save, save / plain, vm["iters"].as<int>());
  std::printf("  best runs: plain %.3f GiB/s, save %.3f GiB/s: %.2fx; CPU seconds (medians): plain %.3f, save %.3f: "
              "the save costs %.2fx the plain write's CPU\n",
              best_plain, best_save, best_save / best_plain, cpu_plain, cpu_save, cpu_save / cpu_plain);
  PrintJson({{"plain_write_gib_s", Num(plain)}, {"save_gib_s", Num(save)}, {"save_vs_plain", Num(save / plain)},
             {"best_save_vs_plain", Num(best_save / best_plain)}, {"cpu_save_over_plain", Num(cpu_save / cpu_plain)},
             {"unaligned", Num(unaligned)}, {"always_stage", Num(options.always_stage)}});
  return 0;
}
