// The process's helper thread (engine/core/helper_thread.h): jobs run in order off the caller's
// thread, WaitForHelperThread waits for the awaited ones, a busy thread refuses what only runs
// when idle, a forked child drops what its parent queued, and a large load hands its manifest off.
#include "shardckpt/engine/core/helper_thread.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

// The fork test starts a thread in a child of a threaded process, which ThreadSanitizer stops by
// default (`cmake --preset tsan`).
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }

namespace shardckpt {
namespace {

// A job that runs until released; released (and waited for) at the latest when this goes, so that
// a failed assertion never leaves the thread blocked on a dead test's promise.
class BlockingJob {
 public:
  BlockingJob() : released_(release_.get_future().share()) {}
  ~BlockingJob() { Release(); WaitForHelperThread(); }
  HelperJob Job() {
    HelperJob job;
    job.run = [this, released = released_] {
      started_.set_value();
      released.wait();
    };
    return job;
  }
  void WaitStarted() { started_.get_future().wait(); }
  void Release() {
    if (!released_once_) release_.set_value();
    released_once_ = true;
  }

 private:
  std::promise<void> started_, release_;
  std::shared_future<void> released_;
  bool released_once_ = false;
};

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

TEST(HelperThreadTest, RefusesAJobWithNothingToRun) {
  Status refused = RunOnHelperThread(HelperJob{});
  EXPECT_EQ(refused.code(), Code::kInvalidArgument) << refused.ToString();
}

TEST(HelperThreadTest, ABusyThreadRefusesAnIdleOnlyJobAndWaitSkipsUnawaitedOnes) {
  BlockingJob blocking;
  ASSERT_TRUE(RunOnHelperThread(blocking.Job()).ok());
  blocking.WaitStarted();
  std::atomic<int> ran{0};
  HelperJob idle_only;
  idle_only.run = [&ran] { ++ran; };
  idle_only.only_if_idle = true;
  EXPECT_EQ(RunOnHelperThread(idle_only).code(), Code::kFailedPrecondition);
  blocking.Release();
  WaitForHelperThread();
  EXPECT_TRUE(RunOnHelperThread(idle_only).ok());
  WaitForHelperThread();
  EXPECT_EQ(ran.load(), 1);

  // An unawaited job still blocked: the wait returns all the same.
  BlockingJob unawaited;
  HelperJob job = unawaited.Job();
  job.awaited = false;
  ASSERT_TRUE(RunOnHelperThread(std::move(job)).ok());
  unawaited.WaitStarted();
  std::future<void> waited = std::async(std::launch::async, [] { WaitForHelperThread(); });
  EXPECT_EQ(waited.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  unawaited.Release();
}

// The child gets the jobs' `drop`s (one running in the parent, one queued) and none of their
// `run`s or `finish`es, then runs a job of its own. Exit code 0 when all of that held.
TEST(HelperThreadTest, AForkedChildDropsTheParentsJobsAndRunsItsOwn) {
  static int drops_in_child = 0;  // written by the child's atfork handler
  drops_in_child = 0;
  std::atomic<int> runs_of_queued{0}, finishes{0};
  BlockingJob blocking;
  HelperJob running = blocking.Job();
  running.drop = [] { ++drops_in_child; };
  running.finish = [&finishes] { ++finishes; };
  ASSERT_TRUE(RunOnHelperThread(std::move(running)).ok());
  HelperJob queued;
  queued.run = [&runs_of_queued] { ++runs_of_queued; };
  queued.finish = [&finishes] { ++finishes; };
  queued.drop = [] { drops_in_child += 10; };
  ASSERT_TRUE(RunOnHelperThread(std::move(queued)).ok());
  blocking.WaitStarted();  // the first is running, the second waits behind it

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);  // a child that kept its parent's jobs would wait for them forever
    int ran_own = 0;
    HelperJob own;
    own.run = [&ran_own] { ran_own = 1; };
    const bool queued_own = RunOnHelperThread(std::move(own)).ok();
    WaitForHelperThread();
    const bool ok = drops_in_child == 11 && queued_own && ran_own == 1 && runs_of_queued.load() == 0 &&
                    finishes.load() == 0;
    ::_exit(ok ? 0 : 1 + drops_in_child);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw drops_in_child = " << WEXITSTATUS(status) - 1;
  // The parent's jobs are its own still: both run and finish, none dropped.
  blocking.Release();
  WaitForHelperThread();
  EXPECT_EQ(runs_of_queued.load(), 1);
  EXPECT_EQ(finishes.load(), 2);
  EXPECT_EQ(drops_in_child, 0);
}

// A load of 1,024 entries or more hands its manifest to the helper thread; a smaller one frees
// it in place.
TEST(HelperThreadTest, ALargeLoadHandsItsManifestOffAndASmallOneDoesNot) {
  testing::TempDir dir;
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  for (int entries : {1100, 10}) {
    std::vector<float> values(entries);
    ShardedState state;
    for (int i = 0; i < entries; ++i) {
      values[i] = static_cast<float>(i);
      ASSERT_TRUE(state.AddTensor("t." + std::to_string(i), DType::kFloat32, {1}, Layout::Whole(), &values[i]).ok());
    }
    const std::string path = JoinPath(dir.path(), "n" + std::to_string(entries));
    ASSERT_TRUE(Save(*comm, path, 1, state).ok());
    std::vector<float> loaded(entries, -1.0f);
    ShardedState targets;
    for (int i = 0; i < entries; ++i) {
      ASSERT_TRUE(targets.AddTensor("t." + std::to_string(i), DType::kFloat32, {1}, Layout::Whole(), &loaded[i]).ok());
    }
    WaitForHelperThread();  // idle, so that the hand-off is not refused as busy
    const uint64_t before = HelperJobsQueued();
    Result<LoadReport> report = Load(*comm, path, targets);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(loaded, values);
    EXPECT_EQ(HelperJobsQueued() - before, entries >= 1024 ? 1u : 0u) << entries << " entries";
  }
}

}  // namespace
}  // namespace shardckpt
