// Helpers shared by the benchmark binaries: sizes, timing across ranks, the raw O_DIRECT
// baselines, and the one-line JSON result. Benchmarks print; the library never does.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "shardckpt/collectives/communicator.h"

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

// Sequential O_DIRECT write of `bytes` (8 MiB requests, one at a time) then fdatasync: the
// storage baseline a checkpoint writer is measured against.
void RawDirectWrite(const std::string& path, uint64_t bytes);
void RawDirectRead(const std::string& path, uint64_t bytes);

double GiBPerSecond(double bytes, double seconds);
// Prints `{"k": v, ...}` on one line (numbers as given, strings quoted).
void PrintJson(const std::map<std::string, std::string>& fields);
std::string Num(double value);

}  // namespace shardckpt::bench
