// One helper thread per process that runs queued jobs in order, off the caller's path.
//
// Why: some work need not hold up the training loop that asked for it. Deleting a retired
// checkpoint's files (background_removal.h) and freeing a load's decoded manifest (tens of
// thousands of heap blocks at many small tensors) both only free resources; the caller goes on
// while this thread does it. One thread serves both, so a process has at most one of them.
//
// The thread starts with the first job: a process that queues nothing has none. A normal exit
// (return from main, exit()) finishes the queue rather than dropping it. A forked child (a
// test's crash child, a DataLoader worker) inherits no thread: it runs `drop` of each job the
// parent had queued or was running (to close a descriptor the child inherited, say), and starts
// a thread of its own with its first job.
#pragma once

#include <functional>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct HelperJob {
  std::function<void()> run;
  std::function<void()> drop;  // may be empty
};

// Queues `job`. An error, with nothing queued, when no thread could be started (a pids limit):
// the caller does the work itself.
Status RunOnHelperThread(HelperJob job);

// Returns once every job queued so far has run.
void WaitForHelperThread();

}  // namespace shardckpt
