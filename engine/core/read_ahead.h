// A load's read of this rank's own data file, started before the manifest is decoded.
//
// Why: a checkpoint of many small tensors has a manifest that takes about as long to read,
// decode, share, match and plan (tens of milliseconds for 20,000 tensors) as its data take to
// read, and the reads used to wait for all of it (issue 14 part 5: the load stood at 0.4x of fio).
// At the world size the checkpoint was saved by, a rank's own file (rank-NNNNN.bin) is what a
// resuming rank loads, so each rank reads it whole, with O_DIRECT through io_uring, while the
// metadata phases run on the CPU; the read phase then verifies and copies from memory, each
// block as soon as its read is done (WaitFor), the checksum table at the file's end read first.
//
// Only where it pays (WorthReadingAhead): the job has the checkpoint's world size (rank 0's probe
// of the rank files), the manifest is large enough for its phases to hide a read, and the file is
// small next to the manifest (so the read is hidden, the memory held is bounded and a rank that
// wants only part of its file wastes little) and under LoadOptions::read_ahead_max_bytes.
// Memory-backed folders are never read ahead (a read there is a copy, nothing to overlap), nor
// where the read would not run in the background (no io_uring, or no O_DIRECT).
//
// A read ahead never fails a load: on any error its bytes are dropped and the load reads the file
// the normal way, which reports the failure if it is real.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {

// Rank 0's facts for the decision, shared with the checkpoint folder before the manifest is decoded.
struct ReadAheadHint {
  uint64_t manifest_bytes = 0;
  // rank-(W-1).bin is in the folder and rank-W.bin is not, W being the loading job's world size.
  bool same_world = false;
};

// Below this a manifest's phases take a few milliseconds at most: nothing worth hiding a read behind.
inline constexpr uint64_t kReadAheadMinManifestBytes = 256u << 10;
// A file up to this many times the manifest's size is read in about the time the metadata phases
// take (about 10 ns per manifest byte against 0.5-1 ns per data byte read, measured in
// benchmarks/README.md "Reading a rank's own file during the metadata phases").
inline constexpr uint64_t kReadAheadBytesPerManifestByte = 16;

// Whether a rank reads its own file of `file_bytes` ahead; `max_bytes` 0 turns it off.
bool WorthReadingAhead(const ReadAheadHint& hint, uint64_t file_bytes, uint64_t max_bytes);

class FileReadAhead {
 public:
  // Starts reading `path` whole when WorthReadingAhead agrees and the reads can run in the
  // background; null otherwise (the reason logged at debug level). Its memory comes from the
  // process's spare kept for reads ahead (staging_cache.h, StagingUse::kReadAhead) and, with
  // `keep_memory`, goes back there: a repeated load does not fault in its pages again (that
  // zeroing was a tenth of a 20,000-tensor load, on rank 0's path).
  static std::unique_ptr<FileReadAhead> Start(const std::string& path, const ReadAheadHint& hint, uint64_t max_bytes,
                                              const IoOptions& io_options, bool keep_memory = true);
  ~FileReadAhead();

  // Waits for the reads that hold [offset, offset + length) and no others: true when those bytes
  // are in data(), false where one of them failed or the range is not inside the file. A failed
  // read stops the waiting (logged at debug level): the reads done before it stay true, all the
  // others are false from then on, and the caller reads those bytes from the file. The load takes
  // the file's blocks as they arrive, verifying and copying each while later ones are still on
  // their way (a disk completes them about in file order, the order they were submitted).
  bool WaitFor(uint64_t offset, uint64_t length);
  // Waits for every read; the file's bytes, or null where a read failed.
  const unsigned char* Wait() { return WaitFor(0, bytes_) ? data() : nullptr; }
  const unsigned char* data() const { return memory_.pool()->at(0).data(); }
  // The bytes of the reads completed before any failure (the bytes read ahead a load counts:
  // those a failure cut short and the load read again from the file count there too).
  uint64_t bytes_completed() const { return bytes_completed_; }
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }

 private:
  FileReadAhead() = default;
  struct Read {
    uint64_t offset = 0, length = 0;
    bool done = false;
  };

  std::string path_;
  uint64_t bytes_ = 0;
  StagingLease memory_;  // one buffer, at least bytes_ long
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<File> file_;
  std::vector<Read> reads_;  // by tag: the file's tail (its checksum table) first, then in file order
  uint64_t bytes_completed_ = 0;
  Status failure_;
  bool dropped_ = false;
};

}  // namespace shardckpt
