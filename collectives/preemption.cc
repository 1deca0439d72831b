#include "shardckpt/collectives/preemption.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>

namespace shardckpt {
namespace {

// Signal dispositions belong to the process, so the state the handler writes does too. Only
// lock-free atomics are touched in the handler (async-signal-safe); clock_gettime is on POSIX's
// list of async-signal-safe functions.
static_assert(std::atomic<int64_t>::is_always_lock_free, "the signal handler needs lock-free atomics");
std::atomic<bool> g_installed{false};
std::atomic<bool> g_claimed{false};      // the first request claims the slot...
std::atomic<int> g_signal_plus_one{0};  // ...and publishes it here last (0: nothing yet)
std::atomic<int64_t> g_mono_ns{0};
std::atomic<int64_t> g_unix_ns{0};

int64_t NowNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Later requests change nothing: the grace period started with the first.
void Record(int signal) {
  if (g_claimed.exchange(true)) return;
  g_mono_ns.store(NowNs(CLOCK_MONOTONIC));
  g_unix_ns.store(NowNs(CLOCK_REALTIME));
  g_signal_plus_one.store(signal + 1, std::memory_order_release);
}

// The handlers the watcher replaced, for chaining: a program's own SIGTERM handler (a logger, a
// framework's shutdown hook) keeps running. Written before our handler is installed and only
// read by it.
struct sigaction g_previous[NSIG];

bool IsFunction(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) ? action.sa_sigaction != nullptr
                                        : action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN;
}

extern "C" void OnStopSignal(int signal, siginfo_t* info, void* context) {
  int saved_errno = errno;  // the interrupted code may be about to read errno
  Record(signal);
  // Not SIG_DFL: the point is not to die; not SIG_IGN: nothing to do.
  const struct sigaction& previous = g_previous[signal];
  if (IsFunction(previous) && previous.sa_sigaction != OnStopSignal) {
    if (previous.sa_flags & SA_SIGINFO) {
      previous.sa_sigaction(signal, info, context);
    } else {
      previous.sa_handler(signal);
    }
  }
  errno = saved_errno;
}

}  // namespace

std::vector<int> DefaultPreemptionSignals() { return {SIGTERM, SIGUSR1}; }

std::string SignalName(int signal) {
  switch (signal) {
    case 0: return "a stop request";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGALRM: return "SIGALRM";
    case SIGXCPU: return "SIGXCPU";
    default: return "signal " + std::to_string(signal);
  }
}

Result<std::unique_ptr<PreemptionWatcher>> PreemptionWatcher::Install(std::vector<int> signals) {
  for (int signal : signals) {
    if (signal <= 0 || signal >= NSIG || signal == SIGKILL || signal == SIGSTOP) {
      return InvalidArgument("preemption: " + SignalName(signal) + " cannot be caught");
    }
  }
  if (g_installed.exchange(true)) {
    return FailedPrecondition("preemption: a PreemptionWatcher is already installed in this process");
  }
  g_claimed = false;
  g_signal_plus_one = 0;
  auto watcher = std::unique_ptr<PreemptionWatcher>(new PreemptionWatcher());
  for (int signal : signals) {
    // Once each: a second sigaction would take the watcher's own handler for the program's.
    if (std::find(watcher->signals_.begin(), watcher->signals_.end(), signal) == watcher->signals_.end()) {
      watcher->signals_.push_back(signal);
    }
  }
  struct sigaction action {};
  action.sa_sigaction = OnStopSignal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: interrupted reads, writes and waits resume instead of failing (calls that never
  // restart, such as io_uring_enter and poll, are retried by their callers).
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  for (int signal : watcher->signals_) {
    struct sigaction previous {};
    if (sigaction(signal, nullptr, &previous) != 0) {
      return ErrnoStatus(errno, "preemption: sigaction(" + SignalName(signal) + ")");  // destructor restores
    }
    g_previous[signal] = previous;  // before our handler can run
    if (sigaction(signal, &action, nullptr) != 0) {
      return ErrnoStatus(errno, "preemption: sigaction(" + SignalName(signal) + ")");
    }
    watcher->previous_.push_back(previous);
  }
  return watcher;
}

PreemptionWatcher::~PreemptionWatcher() {
  for (size_t i = 0; i < previous_.size(); ++i) {
    // A handler the program installed after the watcher is its own: leave it in place.
    struct sigaction now {};
    if (sigaction(signals_[i], nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == OnStopSignal) {
      sigaction(signals_[i], &previous_[i], nullptr);
    }
  }
  g_installed = false;
}

void PreemptionWatcher::RequestStop(int signal) { Record(signal); }

void PreemptionWatcher::IgnoreLateSignals() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  for (int signal : signals_) sigaction(signal, &ignore, nullptr);
}

LocalStop PreemptionWatcher::Local() const {
  LocalStop local;
  int plus_one = g_signal_plus_one.load(std::memory_order_acquire);
  if (plus_one == 0) return local;
  local.requested = true;
  local.signal = plus_one - 1;
  local.seconds_since = static_cast<double>(NowNs(CLOCK_MONOTONIC) - g_mono_ns.load()) / 1e9;
  local.unix_ns = g_unix_ns.load();
  return local;
}

Result<StopRequest> PreemptionWatcher::ShouldStop(Communicator& comm) const {
  LocalStop local = Local();
  // One MAX all-reduce carries everything: the lowest requesting rank (as size - rank, so the
  // maximum is the lowest) with its signal in the low byte, and the longest time since a request.
  int64_t values[2] = {0, -1};
  if (local.requested) {
    values[0] = (static_cast<int64_t>(comm.size() - comm.rank()) << 8) | (local.signal & 0xff);
    values[1] = static_cast<int64_t>(local.seconds_since * 1e9);
  }
  SC_RETURN_IF_ERROR(comm.AllReduceMaxInt64(values, 2));
  StopRequest stop;
  if (values[0] == 0) return stop;
  stop.requested = true;
  stop.signal = static_cast<int>(values[0] & 0xff);
  stop.first_rank = comm.size() - static_cast<int>(values[0] >> 8);
  stop.seconds_since = static_cast<double>(values[1]) / 1e9;
  return stop;
}

FinalSaveDecision DecideFinalSave(double remaining_s, double estimate_s) {
  // Saves of the same state vary by 10-20% between runs on a shared machine; after the save the
  // job still has to finalize MPI and exit before the scheduler's kill.
  constexpr double kSafetyFactor = 1.25;
  constexpr double kExitAllowanceS = 1.0;
  char text[256];
  if (remaining_s <= kExitAllowanceS) {
    std::snprintf(text, sizeof(text), "%.2fs of the grace period remain, less than the %.0fs kept for exiting",
                  remaining_s, kExitAllowanceS);
    return {false, text};
  }
  if (estimate_s < 0) {
    std::snprintf(text, sizeof(text), "no earlier save in this run to estimate from; %.2fs of the grace period remain",
                  remaining_s);
    return {true, text};
  }
  double needed = estimate_s * kSafetyFactor + kExitAllowanceS;
  std::snprintf(text, sizeof(text),
                "the last save took %.2fs, so a save and exit need about %.2fs; %.2fs of the grace period remain",
                estimate_s, needed, remaining_s);
  return {needed <= remaining_s, text};
}

}  // namespace shardckpt
