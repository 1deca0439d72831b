#include "shardckpt/io/failpoint.h"

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
  static const std::map<std::string, int> kNames = {
      {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EACCES", EACCES}, {"EROFS", EROFS}};
  auto it = kNames.find(name);
  return it == kNames.end() ? 0 : it->second;
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
    if (armed.action != "kill" && armed.action.rfind("sleep:", 0) != 0 &&
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

}  // namespace

Status SetFailpoints(const std::string& spec) {
  std::multimap<std::string, Armed> parsed;
  SC_RETURN_IF_ERROR(Parse(spec, &parsed));
  std::lock_guard<std::mutex> lock(g_mu);
  g_loaded = true;
  g_armed = std::move(parsed);
  return Status::Ok();
}

Status Failpoint(const char* name, const std::string& context) {
  std::string action;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    LoadFromEnvLocked();
    if (g_armed.empty()) return Status::Ok();
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
  if (action.empty()) return Status::Ok();
  if (action == "kill") {
    SC_LOG(kWarn) << "failpoint " << name << ": killing this process";
    ::kill(::getpid(), SIGKILL);
  }
  if (action.rfind("sleep:", 0) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(action.c_str() + 6)));
    return Status::Ok();
  }
  return ErrnoStatus(ErrnoByName(action), context + " [injected at failpoint " + name + "]");
}

}  // namespace shardckpt
