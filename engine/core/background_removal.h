// Deleting a retired checkpoint's data files off the save's path.
//
// Why: unlinking a large file makes the filesystem free its extents, and on ext4 that is slow
// (0.3-0.6 s per 2 GiB measured here, the time of a third of a 2 GiB save). A save with a
// retention policy used to pay it before returning. What has to happen before the save returns
// is only what makes the old checkpoint invisible and that decision durable: its manifest
// unlinked and the folder synced, then the folder renamed out of the step namespace
// (RetiredDirName). The rest, freeing the bytes, is done on the process's helper thread
// (helper_thread.h), while the training loop computes.
//
// A crash at any point leaves either a step folder without a manifest or a `.removing-*`
// folder; the next save of the root removes both (RemoveStaleTempDirs). The next save in this
// process first waits for what is still queued, so the space of at most one generation of
// retired checkpoints is in flight. A normal exit (return from main, exit()) waits for the
// queue; _exit, os._exit and aborts leave what is queued to the next save of the root.
#pragma once

#include <string>

namespace shardckpt {

// Queues the retired folder `path` (absolute: the process may change directory meanwhile) for
// deletion. `locked_fd` is the folder's descriptor with its exclusive flock held (readers see it
// held until the folder is gone); the queue closes it. False, with nothing queued and the
// descriptor still the caller's, when no helper thread could be started.
bool RemoveInBackground(std::string path, int locked_fd);

// Returns once every folder queued so far has been deleted (or its failure logged), with the
// helper thread's other awaited jobs queued before it (not a load's manifest frees).
void WaitForBackgroundRemovals();

}  // namespace shardckpt
