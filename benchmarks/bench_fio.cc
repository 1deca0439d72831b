#include "benchmarks/bench_fio.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "benchmarks/bench_process.h"
#include "shardckpt/io/fs.h"

namespace shardckpt::bench {

namespace {

constexpr uint64_t kPage = 4096;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// tmpfs before Linux 6.6 refuses O_DIRECT; there fio runs buffered, as the raw baseline does.
bool FolderTakesDirect(const std::string& folder) {
  std::string probe = JoinPath(folder, ".fio-direct-probe");
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return errno != EINVAL;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

uint64_t BlockFor(uint64_t bytes, const FioSettings& settings) {
  return std::max<uint64_t>(kPage, std::min(settings.block, bytes / kPage * kPage));
}

}  // namespace

double FioRun::GiBPerSecond() const { return seconds > 0 ? bytes / double(1ull << 30) / seconds : 0; }

uint64_t FioBytes(uint64_t bytes, const FioSettings& settings) {
  uint64_t block = BlockFor(bytes, settings);
  return bytes / block * block;
}

Result<FioRun> ParseFioJson(const std::string& text, const std::vector<FioJob>& jobs) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("jobs") || !doc["jobs"].is_array()) {
    return DataLoss("fio printed no JSON job list: " + text.substr(0, 200));
  }
  FioRun run;
  run.json = text;
  for (const FioJob& want : jobs) {
    auto found = std::find_if(doc["jobs"].begin(), doc["jobs"].end(),
                              [&](const nlohmann::json& j) { return j.value("jobname", "") == want.name; });
    if (found == doc["jobs"].end()) return DataLoss("fio reported no job " + want.name);
    int error = found->value("error", -1);
    if (error != 0) return Internal("fio job " + want.name + " on " + want.path + " failed: error " + std::to_string(error));
    const nlohmann::json& side = (*found)[want.write ? "write" : "read"];
    FioJobResult r{want.name, side.value("io_bytes", uint64_t{0}), side.value("runtime", 0.0) / 1000.0};
    if (r.io_bytes != want.bytes) {
      return DataLoss("fio job " + want.name + " on " + want.path + " moved " + std::to_string(r.io_bytes) + " of " +
                      std::to_string(want.bytes) + " bytes (short " + (want.write ? "write" : "read") + ")");
    }
    run.bytes += r.io_bytes;
    run.seconds = std::max(run.seconds, r.runtime_s);
    run.jobs.push_back(r);
  }
  if (run.seconds <= 0) return DataLoss("fio reported no runtime");
  return run;
}

Result<FioRun> RunFio(const std::vector<FioJob>& asked, const FioSettings& settings) {
  if (asked.empty()) return InvalidArgument("fio: no jobs");
  const bool direct = FolderTakesDirect(DirName(asked[0].path));
  std::vector<FioJob> jobs = asked;
  std::vector<std::string> argv;
  if (settings.huge_pages) {  // kept with the caller's own tunables
    const char* own = std::getenv("GLIBC_TUNABLES");
    argv = {"env", std::string("GLIBC_TUNABLES=") + (own != nullptr && *own != '\0' ? std::string(own) + ":" : "") +
                       "glibc.malloc.hugetlb=1"};
  }
  argv.insert(argv.end(), {settings.binary, "--output-format=json", "--ioengine=io_uring",
                           std::string("--direct=") + (direct ? "1" : "0"),
                           "--iodepth=" + std::to_string(settings.iodepth)});
  for (FioJob& job : jobs) {
    uint64_t block = BlockFor(job.bytes, settings);
    job.bytes = FioBytes(job.bytes, settings);
    if (job.write && settings.fresh_files && ::unlink(job.path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "fio write baseline: removing " + job.path);
    }
    if (!job.write) {
      // fio lays out (writes) a read job's file up to `size` if it is shorter: check first.
      Result<uint64_t> size = FileSize(job.path);
      if (!size.ok()) return size.status().WithContext("fio read baseline");
      if (*size < job.bytes) {
        return DataLoss("fio read baseline: " + job.path + " holds " + std::to_string(*size) + " of " +
                        std::to_string(job.bytes) + " bytes (short read)");
      }
    }
    argv.insert(argv.end(), {"--name=" + job.name, "--filename=" + job.path, "--size=" + std::to_string(job.bytes),
                             "--bs=" + std::to_string(block), std::string("--rw=") + (job.write ? "write" : "read"),
                             std::string("--end_fsync=") + (job.write ? "1" : "0"),
                             std::string("--allow_file_create=") + (job.write ? "1" : "0")});
  }
  double start = Now();
  Result<std::string> out = RunCapture(argv);
  double wall = Now() - start;
  if (!out.ok()) return out.status().WithContext("fio baseline");
  Result<FioRun> run = ParseFioJson(*out, jobs);
  if (!run.ok()) return run;
  run->wall_s = wall;
  run->direct = direct;
  run->huge_pages = settings.huge_pages;
  return run;
}

}  // namespace shardckpt::bench
