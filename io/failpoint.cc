#include "shardckpt/io/failpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

struct Armed {
  int rank = -1;
  long nth = 0;
  std::string action;
  long hits = 0;
};

std::mutex g_mu;
bool g_loaded = false;
std::multimap<std::string, Armed> g_armed;

int ErrnoByName(const std::string& name) {
  // A plain array, never destroyed: failpoints fire on helper threads that may still run while
  // the process's statics are being destroyed (helper_thread.cc drains its queue at exit).
  static constexpr struct {
    const char* name;
    int value;
  } kNames[] = {{"EIO", EIO},     {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EACCES", EACCES},
                {"EROFS", EROFS}, {"EAGAIN", EAGAIN}, {"EBUSY", EBUSY},  {"EPERM", EPERM}};
  for (const auto& known : kNames) {
    if (name == known.name) return known.value;
  }
  return 0;
}

Status Parse(const std::string& spec, std::multimap<std::string, Armed>* out) {
  std::stringstream stream(spec);
  std::string item;
  while (std::getline(stream, item, ';')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) return InvalidArgument("failpoint '" + item + "' has no '='");
    std::string name = item.substr(0, eq);
    Armed armed;
    armed.action = item.substr(eq + 1);
    size_t hash = name.find('#');
    if (hash != std::string::npos) {
      armed.nth = std::atol(name.c_str() + hash + 1);
      name.resize(hash);
    }
    size_t at = name.find('@');
    if (at != std::string::npos) {
      armed.rank = std::atoi(name.c_str() + at + 1);
      name.resize(at);
    }
    if (armed.action != "kill" && armed.action != "short" && armed.action.rfind("sleep:", 0) != 0 &&
        ErrnoByName(armed.action) == 0) {
      return InvalidArgument("failpoint '" + item + "' has an unknown action");
    }
    out->emplace(name, armed);
  }
  return Status::Ok();
}

void LoadFromEnvLocked() {
  if (g_loaded) return;
  g_loaded = true;
  const char* env = std::getenv("SHARDCKPT_FAILPOINTS");
  if (env == nullptr) return;
  Status status = Parse(env, &g_armed);
  if (!status.ok()) SC_LOG(kError) << "SHARDCKPT_FAILPOINTS ignored: " << status.ToString();
}

// Campaigns count the injections that fired, not the ones armed: with
// SHARDCKPT_FAILPOINTS_FIRED=FILE each firing appends "NAME RANK ACTION" to FILE, written
// (O_APPEND, one write) before the action, so a kill is counted too.
void RecordFiring(const char* name, const std::string& action) {
  SC_LOG(kWarn) << "failpoint " << name << " fired (" << action << ")";
  const char* path = std::getenv("SHARDCKPT_FAILPOINTS_FIRED");
  if (path == nullptr || *path == '\0') return;
  int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string line = std::string(name) + " " + std::to_string(ProcessRank()) + " " + action + "\n";
  ssize_t written = ::write(fd, line.data(), line.size());
  (void)written;  // best effort: a campaign that misses the line reports the injection as not fired
  ::close(fd);
}

}  // namespace

Status SetFailpoints(const std::string& spec) {
  std::multimap<std::string, Armed> parsed;
  SC_RETURN_IF_ERROR(Parse(spec, &parsed));
  std::lock_guard<std::mutex> lock(g_mu);
  g_loaded = true;
  g_armed = std::move(parsed);
  return Status::Ok();
}

std::string FailpointAction(const char* name) {
  std::string action;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    LoadFromEnvLocked();
    if (g_armed.empty()) return "";
    auto range = g_armed.equal_range(name);
    for (auto it = range.first; it != range.second; ++it) {
      Armed& armed = it->second;
      if (armed.rank >= 0 && armed.rank != ProcessRank()) continue;
      ++armed.hits;
      if (armed.nth > 0 && armed.hits != armed.nth) continue;
      action = armed.action;
      break;
    }
  }
  if (action.empty()) return "";
  RecordFiring(name, action);
  if (action == "kill") {
    ::kill(::getpid(), SIGKILL);
  }
  if (action.rfind("sleep:", 0) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(action.c_str() + 6)));
  }
  return action;
}

int FailpointErrno(const std::string& action) { return ErrnoByName(action); }

Status Failpoint(const char* name, const std::string& context) {
  int err = ErrnoByName(FailpointAction(name));
  if (err == 0) return Status::Ok();
  return ErrnoStatus(err, context + " [injected at failpoint " + name + "]");
}

}  // namespace shardckpt
