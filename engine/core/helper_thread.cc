#include "shardckpt/engine/core/helper_thread.h"

#include <pthread.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace shardckpt {
namespace {

// What a forked child inherited and must never touch again: kept reachable from here, so that a
// leak checker in the child does not report it.
struct LeftByParent {
  std::deque<HelperJob> jobs;
  std::vector<std::unique_ptr<std::thread>> threads;
};

class HelperThread {
 public:
  // Never destroyed: a thread still running at exit (a Python daemon thread loading) may call
  // Add after the exit hook, which must find a live object that refuses.
  static HelperThread& Instance() {
    static HelperThread* helper = new HelperThread();
    return *helper;
  }

  Status Add(HelperJob job) {
    if (!job.run) return InvalidArgument("a helper job needs something to run");
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status(Code::kAborted, "the process is exiting");
    if (job.only_if_idle && (running_.run || !queue_.empty())) {
      return FailedPrecondition("the helper thread is busy");
    }
    if (!worker_) {
      try {
        worker_ = std::make_unique<std::thread>([this] { Run(); });
      } catch (const std::system_error& e) {
        return Internal(std::string("no helper thread could be started: ") + e.what());
      }
    }
    ++queued_;
    if (job.awaited) awaited_ = queued_;
    queue_.push_back(std::move(job));
    wake_.notify_all();
    return Status::Ok();
  }

  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = awaited_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
  }

  uint64_t Queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_;
  }

 private:
  HelperThread() {
    // The child must not inherit a held lock or the parent's queue: see the header.
    ::pthread_atfork([] { Instance().mu_.lock(); }, [] { Instance().mu_.unlock(); },
                     [] { Instance().ForgetParentAfterFork(); });
    // At exit the queue is finished, not dropped: a dropped folder would only be removed by the
    // next save of its root, which may never come. Registered after the statics this thread's
    // jobs use (the logger, the failpoints) were built, so it runs before they are destroyed.
    std::atexit([] { Instance().FinishAtExit(); });
  }

  void FinishAtExit() {
    std::unique_ptr<std::thread> worker;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      wake_.notify_all();
      worker = std::move(worker_);
    }
    if (worker) worker->join();
  }

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
      if (running_.finish) running_.finish();
      running_ = HelperJob{};
      ++finished_;
      done_cv_.notify_all();
    }
  }

  // In the child, right after fork, with mu_ held by the prepare handler.
  void ForgetParentAfterFork() {
    static LeftByParent* left = new LeftByParent();
    for (HelperJob& job : queue_) {
      if (job.drop) job.drop();
    }
    // Moving a deque or a std::function hands over its storage without touching what it holds.
    for (HelperJob& job : queue_) left->jobs.push_back(std::move(job));
    queue_.clear();
    if (running_.run) {
      if (running_.drop) running_.drop();
      left->jobs.push_back(std::move(running_));
      new (&running_) HelperJob();
    }
    finished_ = queued_;
    // The thread exists only in the parent: neither joined nor destroyed here.
    if (worker_) left->threads.push_back(std::move(worker_));
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
  uint64_t awaited_ = 0;  // the number of the last awaited job queued (jobs run in order)
  bool stopping_ = false;
  std::unique_ptr<std::thread> worker_;
};

}  // namespace

Status RunOnHelperThread(HelperJob job) { return HelperThread::Instance().Add(std::move(job)); }

void WaitForHelperThread() { HelperThread::Instance().WaitIdle(); }

uint64_t HelperJobsQueued() { return HelperThread::Instance().Queued(); }

}  // namespace shardckpt
