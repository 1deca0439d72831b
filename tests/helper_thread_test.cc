// The process's helper thread (engine/core/helper_thread.h): jobs run in order off the caller's
// thread, WaitForHelperThread waits for them, and a forked child drops what its parent queued.
#include "shardckpt/engine/core/helper_thread.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace shardckpt {
namespace {

TEST(HelperThreadTest, RunsJobsInOrderOffTheCallersThreadAndWaitWaitsForThem) {
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 50; ++i) {
    HelperJob job;
    job.run = [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    };
    ASSERT_TRUE(RunOnHelperThread(std::move(job)).ok());
  }
  WaitForHelperThread();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(order[i], i);
    EXPECT_NE(threads[i], std::this_thread::get_id());
    EXPECT_EQ(threads[i], threads[0]);  // one thread
  }
}

// The child gets the jobs' `drop`s (one running in the parent, one queued) and none of their
// `run`s, then runs a job of its own. Exit code 0 when all of that held.
TEST(HelperThreadTest, AForkedChildDropsTheParentsJobsAndRunsItsOwn) {
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> runs_of_queued{0};
  static int drops_in_child = 0;  // written by the child's atfork handler
  drops_in_child = 0;
  HelperJob blocking;
  blocking.run = [&started, released] {
    started.set_value();
    released.wait();
  };
  blocking.drop = [] { ++drops_in_child; };
  ASSERT_TRUE(RunOnHelperThread(std::move(blocking)).ok());
  HelperJob queued;
  queued.run = [&runs_of_queued] { ++runs_of_queued; };
  queued.drop = [] { drops_in_child += 10; };
  ASSERT_TRUE(RunOnHelperThread(std::move(queued)).ok());
  started.get_future().wait();  // the first is running, the second waits behind it

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int ran_own = 0;
    HelperJob own;
    own.run = [&ran_own] { ran_own = 1; };
    const bool queued_own = RunOnHelperThread(std::move(own)).ok();
    WaitForHelperThread();  // would hang on the parent's jobs had the child kept them
    const bool ok = drops_in_child == 11 && queued_own && ran_own == 1 && runs_of_queued.load() == 0;
    ::_exit(ok ? 0 : 1 + drops_in_child);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw drops_in_child = " << WEXITSTATUS(status) - 1;
  // The parent's jobs are its own still: both run, none dropped.
  release.set_value();
  WaitForHelperThread();
  EXPECT_EQ(runs_of_queued.load(), 1);
  EXPECT_EQ(drops_in_child, 0);
}

}  // namespace
}  // namespace shardckpt
