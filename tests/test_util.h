// Shared by the tests: deterministic tensor contents that any rank can recompute for any piece
// (so a load at M ranks checks bytes saved at N ranks without communication), and temp folders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"

namespace shardckpt::testing {

// Byte k of element `index` of entry `name`: a hash, so every byte differs between entries,
// elements and positions. Bool elements are 0 or 1 so torch can read them.
uint8_t ExpectedByte(const std::string& name, DType dtype, int64_t index, size_t k);

// The local bytes of `layout` of entry `name` (row-major in the piece's own shape).
std::vector<uint8_t> PieceBytes(const std::string& name, DType dtype, const Shape& shape, const Layout& layout);

// Probes of the fast path, made without the engine, each with the reason when the answer is no.
// Where both say yes, a save or load that fell back to pread/pwrite or buffered I/O is a bug.
bool UringAvailable(std::string* why);                               // io_uring_queue_init
bool DirectIoAvailable(const std::string& dir, std::string* why);    // a file created with O_DIRECT
// Both: the engine's fast path (io_uring with O_DIRECT, so also a load's read ahead) works in
// `dir`, which is not memory-backed.
bool FastPathAvailable(const std::string& dir, std::string* why);
// Whether the kernel has O_DIRECT set on `fd` (fcntl F_GETFL), whatever the engine believes.
bool FdHasODirect(int fd);

// A fresh folder under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace shardckpt::testing
