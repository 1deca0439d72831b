// Preemption: a scheduler's "stop" that every rank agrees on.
//
// Slurm, Kubernetes and torchrun say "stop" with a signal (SIGTERM, or the one chosen with
// Slurm's --signal) and kill the job after a grace period. The signal reaches ranks at different
// moments, or only some of them (a signal sent to one process, a launcher that forwards it late),
// so a rank cannot act on its own signal: it would save a step the others never reach, or wait
// in a collective the others left. Instead:
//
//   auto watcher = PreemptionWatcher::Install().value();   // SIGTERM, SIGUSR1: only set a flag
//   while (training) {
//     ... one step ...
//     StopRequest stop = watcher->ShouldStop(*comm).value();  // collective, once per step
//     if (stop.requested) { final save; exit 0; }              // same answer on every rank
//   }
//
// ShouldStop is one all-reduce of two 64-bit integers through the Communicator (with its
// deadline: a rank that never arrives is named, nothing hangs), cheap enough for every step
// (benchmarks/bench_preempt_check). Since every rank calls it at the same step and gets the
// same result, every rank stops after the same step.
#pragma once

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

// The agreed answer of ShouldStop: identical on every rank.
struct StopRequest {
  bool requested = false;
  int signal = 0;      // the signal of `first_rank` (0 for RequestStop without one)
  int first_rank = -1;  // the lowest rank that received a stop request
  // Since the earliest reception on any rank (each rank measures its own monotonic clock):
  // the scheduler's grace period started at least this long ago.
  double seconds_since = 0;
};

// What this process itself received, for its own log.
struct LocalStop {
  bool requested = false;
  int signal = 0;
  double seconds_since = 0;  // monotonic
  int64_t unix_ns = 0;       // wall clock at reception, for correlating with scheduler logs
};

std::vector<int> DefaultPreemptionSignals();  // SIGTERM, SIGUSR1

class PreemptionWatcher {
 public:
  // Installs a handler for each signal (with SA_RESTART) that records the first signal received
  // and when: async-signal-safe, and the process no longer dies of these signals. A handler the
  // program had installed (a function, not SIG_DFL or SIG_IGN) still runs after the recording.
  // One watcher per process (signal dispositions are per process); the previous handlers come
  // back when it is destroyed, except where the program installed another one meanwhile (which
  // also means the watcher no longer sees that signal).
  static Result<std::unique_ptr<PreemptionWatcher>> Install(std::vector<int> signals = DefaultPreemptionSignals());
  ~PreemptionWatcher();
  PreemptionWatcher(const PreemptionWatcher&) = delete;
  PreemptionWatcher& operator=(const PreemptionWatcher&) = delete;

  // Collective: every rank calls it at the same point of the same step.
  Result<StopRequest> ShouldStop(Communicator& comm) const;
  // This rank only, no communication.
  LocalStop Local() const;
  // As if `signal` had arrived (a time limit, a test); 0 means "no signal".
  void RequestStop(int signal = 0);
  // The job is done: from now on these signals are ignored (the destructor leaves them so).
  // Without it, a stop the launcher forwards while the ranks finalize MPI and exit (a SIGTERM a
  // moment after the last step) killed them with the default action: the job exited 138 with
  // every step and the final checkpoint done. Processes started afterwards inherit SIG_IGN.
  void IgnoreLateSignals();

  const std::vector<int>& signals() const { return signals_; }

 private:
  PreemptionWatcher() = default;
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

// "SIGTERM", "SIGUSR1", ..., or "signal N"; "a stop request" for 0.
std::string SignalName(int signal);

// Whether a final save estimated to take `estimate_s` (< 0: never measured) may start with
// `remaining_s` of the grace period left. A save that cannot finish is not started: the
// scheduler's kill would leave only a temp folder, and the time is better spent exiting cleanly.
struct FinalSaveDecision {
  bool save = false;
  std::string reason;  // why not, or what it expects
};
FinalSaveDecision DecideFinalSave(double remaining_s, double estimate_s);

}  // namespace shardckpt
