// The library's only way to print. Levels come from SHARDCKPT_LOG (debug|info|warn|error|off,
// default warn) so a quiet library stays quiet inside a training job's output.
#pragma once

#include <sstream>
#include <string>

namespace shardckpt {

enum class LogLevel { kDebug = 0, kInfo, kWarn, kError, kOff };

// The process's rank in the job, for log prefixes and rank-scoped failpoints; -1 outside a job.
void SetProcessRank(int rank);
int ProcessRank();
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogMessage(LogLevel level, const std::string& message);
// Logs `message` the first time `key` is seen in this process (fallback notices, for example).
void LogOnce(LogLevel level, const std::string& key, const std::string& message);

namespace internal {
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine() { LogMessage(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace shardckpt

#define SC_LOG(level)                                                                     \
  for (bool sc_log_on_ = ::shardckpt::LogEnabled(::shardckpt::LogLevel::level); sc_log_on_; \
       sc_log_on_ = false)                                                                  \
  ::shardckpt::internal::LogLine(::shardckpt::LogLevel::level).stream()
