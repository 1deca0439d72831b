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
  job.run = [path] {
    Status status = Failpoint("retention.background_remove", "remove " + path);
    if (status.ok()) status = RemoveTree(path);
    if (!status.ok()) {
      SC_LOG(kWarn) << "could not finish removing " << path << " (" << status.ToString()
                    << "); it holds no manifest, and the next save of its root removes it";
    }
  };
  // Under the queue's lock, so that a forked child never closes the number again after the
  // parent reused it.
  job.finish = [locked_fd] { ::close(locked_fd); };
  // A forked child's copy of the descriptor: kept, it would hold the folder's exclusive lock (and
  // a reader waiting on it) for the child's whole life. The parent finishes the removal.
  job.drop = [locked_fd] { ::close(locked_fd); };
  Status queued = RunOnHelperThread(std::move(job));
  if (queued.code() == Code::kInternal) {
    SC_LOG(kWarn) << queued.message() << "; deleting retired checkpoints before the save returns";
  }
  return queued.ok();
}

void WaitForBackgroundRemovals() { WaitForHelperThread(); }

}  // namespace shardckpt
