// fio as the storage baseline: the best sequential rate this machine's storage gives, measured
// in the same run, on the same folder and bytes as the engine. One fio process runs every job
// at once (one job per rank, each on its own file): io_uring, O_DIRECT, 8 MiB blocks, 16
// requests in flight, fsync at the end of writes. A baseline that moved fewer bytes than asked,
// or that fio reports as failed, is an error, never a fast figure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt::bench {

struct FioJob {
  std::string name;  // e.g. "rank0"
  std::string path;  // its own file
  uint64_t bytes = 0;
  bool write = false;
};

struct FioSettings {
  std::string binary = "fio";
  int iodepth = 16;
  uint64_t block = 8ull << 20;
  // Write jobs start from a new file, as every save does (it never overwrites the blocks of an
  // earlier file): on ext4 here fio overwriting a file it wrote before ran 1.2-1.8x faster than
  // writing a new one, a rate no checkpoint can reach. False: overwrite, for comparison only.
  bool fresh_files = true;
  // fio's I/O buffers come from malloc; glibc's tunable glibc.malloc.hugetlb=1 advises them for
  // transparent huge pages, as shardckpt's staging buffers are (io/aligned_buffer.h). Without it
  // fio's O_DIRECT reads here ran at 0.9 GiB/s against 2.2 GiB/s with it: every 8 MiB request
  // pinned 2048 small pages. A baseline must have the memory the engine has. glibc applies it
  // only where THP is in "madvise" mode (2.35 and later; older ones ignore it). False: plain malloc.
  bool huge_pages = true;
};

struct FioJobResult {
  std::string name;
  uint64_t io_bytes = 0;
  double runtime_s = 0;
};

struct FioRun {
  std::vector<FioJobResult> jobs;
  uint64_t bytes = 0;     // all jobs
  double seconds = 0;     // the longest job's runtime (fio's own clock; end_fsync included)
  double wall_s = 0;      // the fio process, start-up and file set-up included
  bool direct = true;     // false where the folder refuses O_DIRECT
  bool huge_pages = false;  // run with glibc.malloc.hugetlb=1 (FioSettings)
  std::string json;       // fio's output, as it printed it
  double GiBPerSecond() const;
};

// The bytes fio is asked for: whole blocks only (fio pads or drops a partial last block
// depending on direction), so `bytes` rounded down to the block, and a smaller block for a
// file under one block.
uint64_t FioBytes(uint64_t bytes, const FioSettings& settings = {});

// Runs `jobs` in one fio process. Reads never let fio create or extend a file: a file shorter
// than asked is a short read, reported as DataLoss.
Result<FioRun> RunFio(const std::vector<FioJob>& jobs, const FioSettings& settings = {});

// fio's --output-format=json text, checked against `jobs` (already rounded by FioBytes): every
// job present, error 0, exactly its bytes moved.
Result<FioRun> ParseFioJson(const std::string& json, const std::vector<FioJob>& jobs);

}  // namespace shardckpt::bench
