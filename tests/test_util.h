// Shared by the tests: deterministic tensor contents that any rank can recompute for any piece
// (so a load at M ranks checks bytes saved at N ranks without communication), and temp folders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/engine/dtype.h"
#include "shardckpt/engine/layout.h"

namespace shardckpt::testing {

// Byte k of element `index` of entry `name`: a hash, so every byte differs between entries,
// elements and positions. Bool elements are 0 or 1 so torch can read them.
uint8_t ExpectedByte(const std::string& name, DType dtype, int64_t index, size_t k);

// The local bytes of `layout` of entry `name` (row-major in the piece's own shape).
std::vector<uint8_t> PieceBytes(const std::string& name, DType dtype, const Shape& shape, const Layout& layout);

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
