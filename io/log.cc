#include "shardckpt/io/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace shardckpt {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("SHARDCKPT_LOG");
  if (env == nullptr) return LogLevel::kWarn;
  if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(env, "info")) return LogLevel::kInfo;
  if (!std::strcmp(env, "error")) return LogLevel::kError;
  if (!std::strcmp(env, "off")) return LogLevel::kOff;
  return LogLevel::kWarn;
}

std::atomic<int> g_level{static_cast<int>(LevelFromEnv())};
std::atomic<int> g_rank{-1};
std::mutex g_mu;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarn: return "W";
    case LogLevel::kError: return "E";
    default: return "?";
  }
}

}  // namespace

void SetProcessRank(int rank) { g_rank = rank; }
int ProcessRank() { return g_rank.load(); }
void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogMessage(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "[shardckpt %s rank %d] %s\n", LevelName(level), rank, message.c_str());
  } else {
    std::fprintf(stderr, "[shardckpt %s] %s\n", LevelName(level), message.c_str());
  }
}

void LogOnce(LogLevel level, const std::string& key, const std::string& message) {
  static std::set<std::string>* seen = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!seen->insert(key).second) return;
  }
  LogMessage(level, message);
}

}  // namespace shardckpt
