// Helpers shared by the benchmark binaries: sizes, timing across ranks, the raw O_DIRECT
// baselines, and the one-line JSON result. Benchmarks print; the library never does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "benchmarks/bench_fio.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/io/status.h"

namespace shardckpt::bench {

// "1GiB", "512MiB", "4096", "2G" -> bytes (ParseByteSize); throws on a bad size.
uint64_t ParseSize(const std::string& text);
double NowSeconds();
// Seconds from a barrier before `body` to a barrier after it; `body` runs on every rank.
template <typename F>
double TimeCollective(Communicator& comm, F&& body) {
  comm.Barrier().IgnoreError();
  double start = NowSeconds();
  body();
  comm.Barrier().IgnoreError();
  return NowSeconds() - start;
}

// Sequential O_DIRECT write of `bytes` (8 MiB requests, one at a time) then fdatasync, and its
// read: the old, weaker baseline (one request in flight), kept beside fio's (bench_fio.h) so
// earlier figures can be compared. A read that gets fewer bytes than asked is DataLoss.
Status RawDirectWrite(const std::string& path, uint64_t bytes);
Status RawDirectRead(const std::string& path, uint64_t bytes);
// Fails the benchmark (every rank calls it with its own status): prints and exits 1.
void CheckOrExit(const Status& status, const std::string& what);

// Drops `path`'s pages from the page cache (they must be clean: it syncs first), so a buffered
// baseline such as cp reads from storage as the engine does.
Status DropCache(const std::string& path);

// fio (bench_fio.h) over every rank's own file `dir/<prefix><rank>` of `bytes_per_rank`, one
// job per rank in one fio process that rank 0 runs between barriers while the others wait.
// Every rank learns fio's verdict and exits 1 on a failure; the figures are rank 0's.
FioRun FioForRanks(Communicator& comm, const std::string& dir, const std::string& prefix, uint64_t bytes_per_rank,
                   bool write);
// "fio write 1.234 GiB/s (io_uring, O_DIRECT, 8 MiB, QD16, 2 jobs, 512 MiB)".
std::string DescribeFio(const FioRun& run, const char* what);

double GiBPerSecond(double bytes, double seconds);
// The middle value of repeated timings (the upper middle for an even count).
double Median(std::vector<double> values);
// Prints `{"k": v, ...}` on one line (numbers as given, strings quoted).
void PrintJson(const std::map<std::string, std::string>& fields);
std::string Num(double value);

}  // namespace shardckpt::bench
