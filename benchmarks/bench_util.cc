#include "benchmarks/bench_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/fs.h"
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

// -1 with errno set; tmpfs before Linux 6.6 refuses O_DIRECT and is opened buffered.
int OpenDirect(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags, 0644);
  return fd;
}

size_t RequestAt(uint64_t done, uint64_t bytes) {
  return static_cast<size_t>(std::min(kRequest, (bytes - done + 4095) / 4096 * 4096));
}

// One 8 MiB request at a time. Requests are rounded up to a page for O_DIRECT; only the bytes
// asked for must move, and fewer is a short read or write (DataLoss), never a fast figure.
Status RawDirect(const std::string& path, uint64_t bytes, bool write) {
  const char* what = write ? "raw write " : "raw read ";
  AlignedBuffer buffer = AlignedBuffer::Allocate(kRequest).value();
  std::memset(buffer.data(), 0x5A, kRequest);
  int fd = OpenDirect(path, write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY);
  if (fd < 0) return ErrnoStatus(errno, what + path);
  Status status;
  for (uint64_t done = 0; done < bytes && status.ok(); done += kRequest) {
    size_t n = RequestAt(done, bytes);
    ssize_t got = write ? ::pwrite(fd, buffer.data(), n, static_cast<off_t>(done))
                        : ::pread(fd, buffer.data(), n, static_cast<off_t>(done));
    if (got < 0) {
      status = ErrnoStatus(errno, what + path);
    } else if (static_cast<uint64_t>(got) < std::min<uint64_t>(n, bytes - done)) {
      status = DataLoss(what + path + ": " + std::to_string(done + got) + " of " + std::to_string(bytes) + " bytes (short " +
                        (write ? "write)" : "read)"));
    }
  }
  if (write && status.ok() && ::fdatasync(fd) != 0) status = ErrnoStatus(errno, "raw write: fdatasync " + path);
  ::close(fd);
  return status;
}
}  // namespace

Status RawDirectWrite(const std::string& path, uint64_t bytes) { return RawDirect(path, bytes, true); }
Status RawDirectRead(const std::string& path, uint64_t bytes) { return RawDirect(path, bytes, false); }

void CheckOrExit(const Status& status, const std::string& what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s failed: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

Status DropCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  int err = ::fdatasync(fd) == 0 ? ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) : errno;
  ::close(fd);
  return err == 0 ? Status::Ok() : ErrnoStatus(err, "dropping the page cache of " + path);
}

FioRun FioForRanks(Communicator& comm, const std::string& dir, const std::string& prefix, uint64_t bytes_per_rank,
                   bool write) {
  FioRun run;
  Status status;
  comm.Barrier().IgnoreError();
  if (comm.rank() == 0) {
    std::vector<FioJob> jobs;
    for (int r = 0; r < comm.size(); ++r) {
      jobs.push_back({"rank" + std::to_string(r), JoinPath(dir, prefix + std::to_string(r)), bytes_per_rank, write});
    }
    Result<FioRun> done = RunFio(jobs);
    if (done.ok()) run = std::move(*done);
    status = done.status();
  }
  CheckOrExit(BroadcastStatus(comm, status, 0), write ? "fio write baseline" : "fio read baseline");
  return run;
}

std::string DescribeFio(const FioRun& run, const char* what) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "fio %s %.3f GiB/s (io_uring, %s, 8 MiB blocks, QD16, %s, %zu jobs, %.0f MiB in %.3fs)", what,
                run.GiBPerSecond(), run.direct ? "O_DIRECT" : "buffered: no O_DIRECT here",
                run.huge_pages ? "glibc.malloc.hugetlb=1" : "plain malloc buffers", run.jobs.size(),
                run.bytes / 1048576.0, run.seconds);
  return buf;
}

double GiBPerSecond(double bytes, double seconds) { return bytes / double(1ull << 30) / seconds; }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

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
