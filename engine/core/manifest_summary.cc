#include "shardckpt/engine/core/manifest_summary.h"

#include <sys/stat.h>

#include <mutex>
#include <unordered_map>

#include "shardckpt/engine/core/load.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {
namespace {

// What makes a remembered summary still the file's: a manifest is written once and never
// changed in place, so a new one under the same path has another inode or times.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};
  timespec changed{};

  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && modified.tv_sec == o.modified.tv_sec &&
           modified.tv_nsec == o.modified.tv_nsec && changed.tv_sec == o.changed.tv_sec &&
           changed.tv_nsec == o.changed.tv_nsec;
  }
};

bool IdentityOf(const std::string& path, FileIdentity* out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *out = FileIdentity{st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
  return true;
}

struct Remembered {
  FileIdentity identity;
  ManifestSummary summary;
};

// One per process. Retention forgets what it removes, so a job holds about the checkpoints it
// keeps. Bounded all the same (other roots listed, folders deleted by hand count too): past
// this many, all is forgotten and each manifest costs a decode again, as before the memory
// existed. An entry is about 100 bytes per data file.
constexpr size_t kMaxRemembered = 4096;

struct Memory {
  std::mutex mu;
  std::unordered_map<std::string, Remembered> by_path;
  uint64_t decodes = 0;

  void Put(const std::string& path, const FileIdentity& identity, const ManifestSummary& summary) {
    std::lock_guard<std::mutex> lock(mu);
    if (by_path.size() >= kMaxRemembered && by_path.count(path) == 0) by_path.clear();
    by_path[path] = Remembered{identity, summary};
  }
};

Memory& TheMemory() {
  static Memory* memory = new Memory;  // never destroyed: saves may run while the process exits
  return *memory;
}

}  // namespace

ManifestSummary SummaryOf(const Manifest& m) {
  ManifestSummary s;
  s.time = m.created.time;
  s.world_size = m.world_size;
  s.metrics = m.metrics;
  s.files.reserve(m.files.size());
  for (const FileRecord& f : m.files) {
    FileRecord named;
    named.name = f.name;
    named.size = f.size;
    s.files.push_back(std::move(named));
  }
  return s;
}

Result<ManifestSummary> ReadManifestSummary(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  Memory& memory = TheMemory();
  FileIdentity before;
  const bool known = IdentityOf(path, &before);
  if (known) {
    std::lock_guard<std::mutex> lock(memory.mu);
    auto it = memory.by_path.find(path);
    if (it != memory.by_path.end() && it->second.identity == before) return it->second.summary;
  }
  SC_ASSIGN_OR_RETURN(Manifest m, ReadManifestFile(path));
  ManifestSummary summary = SummaryOf(m);
  {
    std::lock_guard<std::mutex> lock(memory.mu);
    ++memory.decodes;
  }
  // Remembered under the identity seen before the read: were the file replaced meanwhile, the
  // next call sees another identity and reads it again.
  if (known) memory.Put(path, before, summary);
  return summary;
}

void RememberManifestSummary(const std::string& dir, ManifestSummary summary) {
  const std::string path = JoinPath(dir, kManifestName);
  FileIdentity identity;
  if (IdentityOf(path, &identity)) TheMemory().Put(path, identity, summary);
}

void ForgetManifestSummary(const std::string& dir) {
  Memory& memory = TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  memory.by_path.erase(JoinPath(dir, kManifestName));
}

uint64_t ManifestSummaryDecodes() {
  Memory& memory = TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  return memory.decodes;
}

size_t ManifestSummariesRemembered() {
  Memory& memory = TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  return memory.by_path.size();
}

}  // namespace shardckpt
