#include "shardckpt/engine/core/background_removal.h"

#include <pthread.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <new>
#include <system_error>
#include <mutex>
#include <thread>
#include <utility>

#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

class BackgroundRemover {
 public:
  BackgroundRemover() {
    // A forked child (a test's crash child, a DataLoader worker) has no worker thread and must
    // not inherit a held lock or the parent's queue: the parent finishes its own removals.
    ::pthread_atfork([] { Instance().mu_.lock(); }, [] { Instance().mu_.unlock(); },
                     [] { Instance().ForgetParentAfterFork(); });
  }

  static BackgroundRemover& Instance();

  // The worker starts with the first folder queued: a process that never prunes has no thread.
  // False when no worker could be started (a pids limit): the caller removes the folder itself.
  bool Add(std::string path, int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_) {
      try {
        worker_ = std::make_unique<std::thread>([this] { Run(); });
      } catch (const std::system_error& e) {
        SC_LOG(kWarn) << "no helper thread for deleting retired checkpoints (" << e.what()
                      << "); deleting before the save returns";
        return false;
      }
    }
    queue_.push_back(Job{std::move(path), fd});
    ++queued_;
    wake_.notify_all();
    return true;
  }

  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
  }

  // At exit the queue is finished, not dropped: a dropped folder would only be removed by the
  // next save of its root, which may never come.
  ~BackgroundRemover() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      wake_.notify_all();
    }
    if (worker_) worker_->join();
  }

 private:
  struct Job {
    std::string path;
    int fd;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      in_flight_fd_ = job.fd;
      lock.unlock();
      Status status = Failpoint("retention.background_remove", "remove " + job.path);
      if (status.ok()) status = RemoveTree(job.path);
      ::close(job.fd);
      if (!status.ok()) {
        SC_LOG(kWarn) << "could not finish removing " << job.path << " (" << status.ToString()
                      << "); it holds no manifest, and the next save of its root removes it";
      }
      lock.lock();
      in_flight_fd_ = -1;
      ++finished_;
      done_cv_.notify_all();
    }
  }

  // In the child, right after fork, with mu_ held by the prepare handler.
  void ForgetParentAfterFork() {
    // The child's copies of the parent's descriptors: kept, they would hold the folders'
    // exclusive locks (and a reader waiting on one) for the child's whole life.
    for (const Job& job : queue_) ::close(job.fd);
    if (in_flight_fd_ >= 0) ::close(in_flight_fd_);
    in_flight_fd_ = -1;
    queue_.clear();
    finished_ = queued_;
    (void)worker_.release();  // the thread exists only in the parent: neither joined nor freed
    // The parent's worker may have been waiting on these: start the child's afresh.
    new (&wake_) std::condition_variable();
    new (&done_cv_) std::condition_variable();
    mu_.unlock();
  }

  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::deque<Job> queue_;
  uint64_t queued_ = 0, finished_ = 0;
  int in_flight_fd_ = -1;  // the job the worker is deleting, closed in a forked child
  bool stopping_ = false;
  std::unique_ptr<std::thread> worker_;
};

BackgroundRemover& BackgroundRemover::Instance() {
  static BackgroundRemover remover;
  return remover;
}

}  // namespace

bool RemoveInBackground(std::string path, int locked_fd) {
  return BackgroundRemover::Instance().Add(std::move(path), locked_fd);
}

void WaitForBackgroundRemovals() { BackgroundRemover::Instance().WaitIdle(); }

}  // namespace shardckpt
