// One helper thread per process that runs queued jobs in order, off the caller's path.
//
// Why: some work need not hold up the training loop that asked for it. Deleting a retired
// checkpoint's files (background_removal.h) and freeing a load's decoded manifest (tens of
// thousands of heap blocks at many small tensors) both only release resources; the caller goes on
// while this thread does it. One thread serves both, so a process has at most one of them.
//
// The thread starts with the first job: a process that queues nothing has none. A normal exit
// (return from main, exit()) finishes the queue rather than dropping it; a job queued after that
// is refused. A forked child (a test's crash child, a DataLoader worker) inherits no thread: it
// runs `drop` of each job the parent had queued or was running (to close a descriptor the child
// inherited, say), never touches those jobs again (not even to free them: that would copy the
// parent's pages, or read what the parent's thread was halfway through changing), and starts a
// thread of its own with its first job.
#pragma once

#include <cstdint>
#include <functional>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct HelperJob {
  std::function<void()> run;     // required
  // Optional, run under the queue's lock right after `run`: a fork sees the job either running
  // (and the child drops it) or finished, never between. A descriptor closed here is closed once.
  std::function<void()> finish;
  std::function<void()> drop;    // optional: in a forked child, for a job of the parent's
  // WaitForHelperThread waits for it. False for a job that only frees memory, which nobody waits
  // for (a save's wait for the retired checkpoints does not wait for a load's manifest).
  bool awaited = true;
  // Refused (FailedPrecondition) while another job is queued or running: memory that would wait
  // behind a slow removal is better freed by the caller at once.
  bool only_if_idle = false;
};

// Queues `job`. Refused, with nothing queued, when `run` is empty (InvalidArgument), when
// only_if_idle and the thread is busy (FailedPrecondition), when the process is exiting (Aborted)
// or when no thread could be started (Internal, say a pids limit): the caller does the work then.
Status RunOnHelperThread(HelperJob job);

// Returns once every awaited job queued so far has run (and those queued before it).
void WaitForHelperThread();

// Jobs queued since the process started (tests check which calls hand work off).
uint64_t HelperJobsQueued();

}  // namespace shardckpt
