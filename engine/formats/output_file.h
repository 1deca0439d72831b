// A sequentially written output file (consolidated .pt / .safetensors): O_DIRECT writes through
// the library's aligned sequential writer (io/sequential_writer.h; the page cache path measured
// 4x slower than direct I/O for multi-GiB exports), eight 4 MiB staging buffers so that several
// writes are in flight while the next buffer fills, the last partial block padded and the file
// cut to its exact size, a running SHA-256 of every byte (for FILE.sha256), fsync and an atomic
// rename into place on Close, so a crashed export never leaves a half file under the final name.
// The SHA-256 of each staged buffer runs on a helper thread while the next buffer fills: on the
// caller's thread it was a fifth of a consolidation's time, beside copies it cannot hand off.
#pragma once

#include <openssl/evp.h>

#include <future>
#include <memory>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/io_engine.h"
#include "shardckpt/io/sequential_writer.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

class OutputFile {
 public:
  // `expected_bytes`, the file's size about (0: unknown), sizes the staging: writes in flight in
  // proportion to the file, 2 to 8 buffers of 4 MiB.
  static Result<std::unique_ptr<OutputFile>> Create(const std::string& path, uint64_t expected_bytes = 0);
  // The staging buffers (4 MiB each) Create gives a file of `expected_bytes`.
  static size_t BuffersFor(uint64_t expected_bytes);
  ~OutputFile();
  Status Write(const void* data, size_t bytes);
  uint64_t position() const { return position_; }
  // Flushes, fsyncs, renames into place and writes PATH.sha256 (`sha256sum -c` form).
  Status Close();
  // Close in two steps, for exports of several files that must appear together: Finish writes
  // and fsyncs the file under PATH.partial and frees its buffers; Publish renames it into place
  // and writes PATH.sha256. A file never published is removed with its OutputFile.
  Status Finish();
  Status Publish();
  // The first step of Publish, for a set whose files must all be able to publish before any
  // replaces its predecessor: writes PATH.sha256's new text under PATH.sha256.tmp (a full disk
  // fails here, with nothing replaced). Publish calls it when it was not called. A process killed
  // between the two leaves PATH.sha256.tmp, which the next export of PATH replaces.
  Status PrepareSidecar();
  bool published() const { return published_; }
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }

 private:
  OutputFile() = default;
  // SequentialWriter's hook: hashes the file's bytes in `data` (not the padding after the end).
  Status HashBuffer(const unsigned char* data, size_t length);
  void WaitForHash();
  std::string path_, temp_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<SequentialWriter> writer_;  // last: destroyed (its writes waited for) first
  uint64_t position_ = 0;
  uint64_t hashed_ = 0;  // file bytes handed to the hash so far
  EVP_MD_CTX* sha_ = nullptr;
  std::future<void> hash_;  // the buffer being hashed; done before the next one starts
  std::string sha256_;
  bool sidecar_prepared_ = false;
  bool published_ = false;
};

// An export's hold on its output path for as long as it writes there. Two exports to one path
// at once (two `consolidate --out x.pt`) wrote one x.pt.partial together, and the one that
// finished published a mixed file beside a .sha256 of neither. The second is refused at once,
// naming the path. The hold is an flock on .NAME.lock in the output's folder, removed on release;
// on a file system without flock exports are not held (logged once).
class OutputLock {
 public:
  // The output's folder must exist.
  static Result<OutputLock> Acquire(const std::string& out);
  OutputLock(OutputLock&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) { other.fd_ = -1; }
  OutputLock& operator=(OutputLock&&) = delete;
  OutputLock(const OutputLock&) = delete;
  ~OutputLock();

 private:
  OutputLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// Removes an export's file and its PATH.sha256, whichever of them exist.
void RemoveOutputFile(const std::string& path);

// The files of one export that writes several (safetensors shards and their index, a DCP
// folder's data files): each published file is final under its name, so a failure after the
// first would leave a partial set that looks whole. Unless Keep() is called, the destructor
// removes every file added (with its .sha256), or the whole folder when the export created it.
// Add only files this export published: a name added before its rename may still be the user's
// previous file.
class OutputSet {
 public:
  explicit OutputSet(std::string created_dir = "") : created_dir_(std::move(created_dir)) {}
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();
  void Add(const std::string& path) { paths_.push_back(path); }
  void Keep() { keep_ = true; }

 private:
  std::string created_dir_;
  std::vector<std::string> paths_;
  bool keep_ = false;
};

}  // namespace shardckpt
