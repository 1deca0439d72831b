#include "tests/test_util.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "shardckpt/io/fs.h"

namespace shardckpt::testing {

namespace {
uint64_t NameSeed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

uint8_t ExpectedByteFromSeed(uint64_t h, DType dtype, int64_t index, size_t k) {
  h ^= static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull + k * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  if (dtype == DType::kBool) return static_cast<uint8_t>(h & 1);
  return static_cast<uint8_t>(h);
}
}  // namespace

uint8_t ExpectedByte(const std::string& name, DType dtype, int64_t index, size_t k) {
  return ExpectedByteFromSeed(NameSeed(name), dtype, index, k);
}

std::vector<uint8_t> PieceBytes(const std::string& name, DType dtype, const Shape& shape, const Layout& layout) {
  const size_t element = DTypeSize(dtype);
  Shape local = LocalShape(layout, shape);
  std::vector<uint8_t> bytes(static_cast<size_t>(NumElements(local).value()) * element);
  // The whole tensor as a region whose local offset is the global linear index.
  std::vector<Region> whole = LayoutRegions(Layout::Whole(), shape);
  if (whole.empty()) return bytes;
  // Hashed once per piece, not per byte: the sanitizer build checks megabytes of these.
  const uint64_t seed = NameSeed(name);
  uint8_t* out = bytes.data();
  for (const Region& piece : LayoutRegions(layout, shape)) {
    ForEachCopy(whole[0], piece, [&](int64_t global, int64_t at, int64_t count) {
      for (int64_t i = 0; i < count; ++i) {
        for (size_t k = 0; k < element; ++k) {
          out[static_cast<size_t>(at + i) * element + k] = ExpectedByteFromSeed(seed, dtype, global + i, k);
        }
      }
    });
  }
  return bytes;
}

bool UringAvailable(std::string* why) {
  struct io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    *why = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

bool DirectIoAvailable(const std::string& dir, std::string* why) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
    *why = dir + " is memory-backed: the engine skips O_DIRECT there by design";
    return false;
  }
  const std::string path = JoinPath(dir, ".odirect-probe");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = "open(" + path + ", O_DIRECT): " + std::strerror(errno);
    return false;
  }
  ::close(fd);
  ::unlink(path.c_str());
  return true;
}

bool FastPathAvailable(const std::string& dir, std::string* why) {
  return UringAvailable(why) && DirectIoAvailable(dir, why);
}

bool FdHasODirect(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) != 0;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/shardckpt-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() { RemoveTree(path_).IgnoreError(); }

}  // namespace shardckpt::testing
