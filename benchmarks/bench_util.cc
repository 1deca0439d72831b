#include "benchmarks/bench_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/size_text.h"

namespace shardckpt::bench {

uint64_t ParseSize(const std::string& text) {
  Result<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) throw std::invalid_argument(bytes.status().message());
  return *bytes;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
constexpr uint64_t kRequest = 8ull << 20;

int OpenDirect(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  if (fd < 0) fd = ::open(path.c_str(), flags, 0644);  // tmpfs without O_DIRECT
  if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
  return fd;
}
}  // namespace

void RawDirectWrite(const std::string& path, uint64_t bytes) {
  AlignedBuffer buffer = AlignedBuffer::Allocate(kRequest).value();
  std::memset(buffer.data(), 0x5A, kRequest);
  int fd = OpenDirect(path, O_WRONLY | O_CREAT | O_TRUNC);
  for (uint64_t done = 0; done < bytes; done += kRequest) {
    size_t n = static_cast<size_t>(std::min(kRequest, (bytes - done + 4095) / 4096 * 4096));
    if (::pwrite(fd, buffer.data(), n, static_cast<off_t>(done)) != static_cast<ssize_t>(n)) {
      throw std::runtime_error("raw write failed");
    }
  }
  ::fdatasync(fd);
  ::close(fd);
}

void RawDirectRead(const std::string& path, uint64_t bytes) {
  AlignedBuffer buffer = AlignedBuffer::Allocate(kRequest).value();
  int fd = OpenDirect(path, O_RDONLY);
  for (uint64_t done = 0; done < bytes; done += kRequest) {
    size_t n = static_cast<size_t>(std::min(kRequest, (bytes - done + 4095) / 4096 * 4096));
    if (::pread(fd, buffer.data(), n, static_cast<off_t>(done)) <= 0) throw std::runtime_error("raw read failed");
  }
  ::close(fd);
}

double GiBPerSecond(double bytes, double seconds) { return bytes / double(1ull << 30) / seconds; }

std::string Num(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g", value);
  return buf;
}

void PrintJson(const std::map<std::string, std::string>& fields) {
  std::string out = "{";
  for (const auto& [key, value] : fields) {
    if (out.size() > 1) out += ", ";
    out += "\"" + key + "\": " + value;
  }
  std::printf("%s}\n", out.c_str());
  std::fflush(stdout);
}

}  // namespace shardckpt::bench
