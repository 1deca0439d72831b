#include "shardckpt/engine/core/helper_thread.h"

#include <pthread.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

namespace shardckpt {
namespace {

class HelperThread {
 public:
  HelperThread() {
    // The child must not inherit a held lock or the parent's queue: see the header.
    ::pthread_atfork([] { Instance().mu_.lock(); }, [] { Instance().mu_.unlock(); },
                     [] { Instance().ForgetParentAfterFork(); });
  }

  static HelperThread& Instance() {
    static HelperThread helper;
    return helper;
  }

  Status Add(HelperJob job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_) {
      try {
        worker_ = std::make_unique<std::thread>([this] { Run(); });
      } catch (const std::system_error& e) {
        return Internal(std::string("no helper thread could be started: ") + e.what());
      }
    }
    queue_.push_back(std::move(job));
    ++queued_;
    wake_.notify_all();
    return Status::Ok();
  }

  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
  }

  ~HelperThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      wake_.notify_all();
    }
    if (worker_) worker_->join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      // Kept in a member while it runs, so that a forked child can drop it.
      running_ = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      running_.run();
      lock.lock();
      running_ = HelperJob{};
      ++finished_;
      done_cv_.notify_all();
    }
  }

  // In the child, right after fork, with mu_ held by the prepare handler.
  void ForgetParentAfterFork() {
    for (HelperJob& job : queue_) {
      if (job.drop) job.drop();
    }
    queue_.clear();
    if (running_.drop) running_.drop();
    if (running_.run) {
      // The parent's thread may be halfway through changing what this job holds (freeing a
      // manifest): the child's copy is never touched again, not even to destroy it.
      (void)new HelperJob(std::move(running_));
      new (&running_) HelperJob();
    }
    finished_ = queued_;
    (void)worker_.release();  // the thread exists only in the parent: neither joined nor freed
    // The parent's worker may have been waiting on these: start the child's afresh.
    new (&wake_) std::condition_variable();
    new (&done_cv_) std::condition_variable();
    mu_.unlock();
  }

  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::deque<HelperJob> queue_;
  HelperJob running_;
  uint64_t queued_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::unique_ptr<std::thread> worker_;
};

}  // namespace

Status RunOnHelperThread(HelperJob job) { return HelperThread::Instance().Add(std::move(job)); }

void WaitForHelperThread() { HelperThread::Instance().WaitIdle(); }

}  // namespace shardckpt
