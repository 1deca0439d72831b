#include "shardckpt/engine/core/background_removal.h"

#include <unistd.h>

#include <string>
#include <utility>

#include "shardckpt/engine/core/helper_thread.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

bool RemoveInBackground(std::string path, int locked_fd) {
  HelperJob job;
  job.run = [path, locked_fd] {
    Status status = Failpoint("retention.background_remove", "remove " + path);
    if (status.ok()) status = RemoveTree(path);
    ::close(locked_fd);
    if (!status.ok()) {
      SC_LOG(kWarn) << "could not finish removing " << path << " (" << status.ToString()
                    << "); it holds no manifest, and the next save of its root removes it";
    }
  };
  // A forked child's copy of the descriptor: kept, it would hold the folder's exclusive lock (and
  // a reader waiting on it) for the child's whole life. The parent finishes the removal.
  job.drop = [locked_fd] { ::close(locked_fd); };
  Status queued = RunOnHelperThread(std::move(job));
  if (!queued.ok()) {
    SC_LOG(kWarn) << queued.message() << "; deleting retired checkpoints before the save returns";
    return false;
  }
  return true;
}

void WaitForBackgroundRemovals() { WaitForHelperThread(); }

}  // namespace shardckpt
