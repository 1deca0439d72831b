#include "shardckpt/collectives/preemption.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>

namespace shardckpt {
namespace {

// A single-process communicator that claims to be rank `rank` of `size`: the all-reduce sees
// only this rank's values, which is enough to check how the request is encoded and decoded.
class RankOf final : public Communicator {
 public:
  RankOf(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "fake"; }
  bool thread_safe() const override { return true; }
  Status Barrier() override { return Status::Ok(); }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Gather(const std::string&, std::vector<std::string>*, int) override { return Status::Ok(); }
  Status AllGather(const std::string&, std::vector<std::string>*) override { return Status::Ok(); }
  Status AllReduceMaxInt64(int64_t*, size_t) override { return reduce_status; }
  Status AllReduceSumDouble(double*, size_t) override { return Status::Ok(); }
  Status AllGatherFloat(const float*, size_t, float*) override { return Status::Ok(); }
  Status ReduceScatterSumFloat(const float*, float*, size_t) override { return Status::Ok(); }
  Result<std::unique_ptr<Communicator>> Duplicate() override { return Status(Code::kInternal, "no"); }
  Status reduce_status;

 private:
  int rank_, size_;
};

TEST(PreemptionWatcher, SignalSetsAFlagInsteadOfKilling) {
  auto watcher = PreemptionWatcher::Install().value();
  auto comm = CreateSingleProcessCommunicator();
  StopRequest before = watcher->ShouldStop(*comm).value();
  EXPECT_FALSE(before.requested);
  EXPECT_EQ(before.first_rank, -1);
  EXPECT_FALSE(watcher->Local().requested);

  ASSERT_EQ(raise(SIGUSR1), 0);  // the default action would end this test binary
  ASSERT_EQ(raise(SIGTERM), 0);  // a later signal does not replace the first
  LocalStop local = watcher->Local();
  EXPECT_TRUE(local.requested);
  EXPECT_EQ(local.signal, SIGUSR1);
  EXPECT_GE(local.seconds_since, 0);
  EXPECT_LT(local.seconds_since, 5);
  EXPECT_GT(local.unix_ns, int64_t{1600000000} * 1000000000);

  StopRequest stop = watcher->ShouldStop(*comm).value();
  EXPECT_TRUE(stop.requested);
  EXPECT_EQ(stop.signal, SIGUSR1);
  EXPECT_EQ(stop.first_rank, 0);
  EXPECT_GE(stop.seconds_since, 0);
  EXPECT_TRUE(watcher->ShouldStop(*comm).value().requested);  // stays requested
}

TEST(PreemptionWatcher, EncodesTheRankAndSignalThroughTheReduction) {
  auto watcher = PreemptionWatcher::Install({SIGUSR2}).value();
  RankOf comm(5, 8);
  EXPECT_FALSE(watcher->ShouldStop(comm).value().requested);
  watcher->RequestStop(SIGXCPU);
  StopRequest stop = watcher->ShouldStop(comm).value();
  EXPECT_TRUE(stop.requested);
  EXPECT_EQ(stop.first_rank, 5);
  EXPECT_EQ(stop.signal, SIGXCPU);
  comm.reduce_status = Status(Code::kDeadlineExceeded, "rank 3 never arrived");
  Result<StopRequest> failed = watcher->ShouldStop(comm);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "rank 3 never arrived");
}

TEST(PreemptionWatcher, RequestStopWithoutASignal) {
  auto watcher = PreemptionWatcher::Install().value();
  RankOf comm(0, 1);
  watcher->RequestStop();
  StopRequest stop = watcher->ShouldStop(comm).value();
  EXPECT_TRUE(stop.requested);
  EXPECT_EQ(stop.signal, 0);
  EXPECT_EQ(SignalName(stop.signal), "a stop request");
}

TEST(PreemptionWatcher, OnePerProcessAndPreviousHandlersComeBack) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGUSR2, &ignore, &saved), 0);
  {
    auto watcher = PreemptionWatcher::Install({SIGUSR2}).value();
    Result<std::unique_ptr<PreemptionWatcher>> second = PreemptionWatcher::Install();
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("already installed"), std::string::npos);
    struct sigaction now {};
    sigaction(SIGUSR2, nullptr, &now);
    EXPECT_NE(now.sa_handler, SIG_IGN);
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN);
  sigaction(SIGUSR2, &saved, nullptr);
  // A fresh watcher starts with no request, whatever the last one saw.
  auto again = PreemptionWatcher::Install().value();
  EXPECT_FALSE(again->Local().requested);
}

std::atomic<int> g_program_handler_calls{0};
extern "C" void ProgramHandler(int) { g_program_handler_calls.fetch_add(1); }
std::atomic<int> g_program_info_signal{0};
extern "C" void ProgramInfoHandler(int signal, siginfo_t* info, void*) {
  if (info != nullptr && info->si_signo == signal) g_program_info_signal = signal;
}

struct sigaction Handler(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  return action;
}

TEST(PreemptionWatcher, AProgramsOwnHandlerStillRuns) {
  struct sigaction saved_usr2 {}, saved_term {};
  struct sigaction program = Handler(ProgramHandler);
  ASSERT_EQ(sigaction(SIGUSR2, &program, &saved_usr2), 0);
  struct sigaction with_info {};
  with_info.sa_sigaction = ProgramInfoHandler;
  with_info.sa_flags = SA_SIGINFO;
  sigemptyset(&with_info.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &with_info, &saved_term), 0);
  g_program_handler_calls = 0;
  g_program_info_signal = 0;
  {
    auto watcher = PreemptionWatcher::Install({SIGUSR2, SIGTERM}).value();
    ASSERT_EQ(raise(SIGUSR2), 0);
    EXPECT_TRUE(watcher->Local().requested);
    EXPECT_EQ(watcher->Local().signal, SIGUSR2);
    EXPECT_EQ(g_program_handler_calls, 1);  // the program's shutdown hook was not silently dropped
    ASSERT_EQ(raise(SIGTERM), 0);
    EXPECT_EQ(g_program_info_signal, SIGTERM);  // with its siginfo
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, ProgramHandler);
  sigaction(SIGUSR2, &saved_usr2, nullptr);
  sigaction(SIGTERM, &saved_term, nullptr);
}

TEST(PreemptionWatcher, AHandlerInstalledLaterIsLeftInPlace) {
  struct sigaction saved {};
  sigaction(SIGUSR2, nullptr, &saved);
  {
    auto watcher = PreemptionWatcher::Install({SIGUSR2}).value();
    struct sigaction program = Handler(ProgramHandler);
    ASSERT_EQ(sigaction(SIGUSR2, &program, nullptr), 0);
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, ProgramHandler);  // not replaced by what was there before the watcher
  sigaction(SIGUSR2, &saved, nullptr);
}

TEST(PreemptionWatcher, ASignalListedTwiceIsHandledAndRestoredOnce) {
  struct sigaction saved {};
  struct sigaction program = Handler(ProgramHandler);
  ASSERT_EQ(sigaction(SIGUSR2, &program, &saved), 0);
  g_program_handler_calls = 0;
  {
    auto watcher = PreemptionWatcher::Install({SIGUSR2, SIGUSR2}).value();
    ASSERT_EQ(raise(SIGUSR2), 0);  // the second entry saw the watcher's own handler as "previous"
    EXPECT_TRUE(watcher->Local().requested);
    EXPECT_EQ(g_program_handler_calls, 1);
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, ProgramHandler);  // not the destroyed watcher's handler
  sigaction(SIGUSR2, &saved, nullptr);
}

// A job that is done ignores stop signals while it exits: SIGUSR2's default action (as
// SIGUSR1's, which launch/mpirun.sh forwards) would end the process.
TEST(PreemptionWatcher, LateSignalsAreIgnoredOnceTheJobIsDone) {
  struct sigaction saved {};
  struct sigaction default_action = Handler(SIG_DFL);
  ASSERT_EQ(sigaction(SIGUSR2, &default_action, &saved), 0);
  {
    auto watcher = PreemptionWatcher::Install({SIGUSR2}).value();
    watcher->IgnoreLateSignals();
    ASSERT_EQ(raise(SIGUSR2), 0);  // would end this test binary with the default action
    EXPECT_FALSE(watcher->Local().requested);  // ignored, not recorded: nothing is left to stop
  }
  struct sigaction after {};
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN);  // the destructor left it ignored, not back to SIG_DFL
  ASSERT_EQ(raise(SIGUSR2), 0);
  sigaction(SIGUSR2, &saved, nullptr);
}

TEST(PreemptionWatcher, RefusesSignalsThatCannotBeCaught) {
  for (int signal : {SIGKILL, SIGSTOP, 0, -3}) {
    Result<std::unique_ptr<PreemptionWatcher>> watcher = PreemptionWatcher::Install({SIGTERM, signal});
    ASSERT_FALSE(watcher.ok()) << signal;
    EXPECT_EQ(watcher.status().code(), Code::kInvalidArgument);
    EXPECT_NE(watcher.status().message().find("cannot be caught"), std::string::npos);
  }
  EXPECT_EQ(SignalName(SIGKILL), "signal 9");
  // A refused set installs nothing, so the next install works.
  EXPECT_TRUE(PreemptionWatcher::Install().ok());
}

TEST(DecideFinalSave, SavesOnlyWhatCanFinishWithinTheGracePeriod) {
  struct Case {
    double remaining_s, estimate_s;
    bool save;
    const char* says;
  };
  const Case cases[] = {
      {60, 2, true, "the last save took 2.00s, so a save and exit need about 3.50s; 60.00s of the grace period remain"},
      {3.5, 2, true, "need about 3.50s; 3.50s"},
      {3.4, 2, false, "need about 3.50s; 3.40s"},
      {30, 40, false, "the last save took 40.00s"},
      {10, -1, true, "no earlier save in this run to estimate from; 10.00s of the grace period remain"},
      {1.0, -1, false, "1.00s of the grace period remain, less than the 1s kept for exiting"},
      {0.5, 0.01, false, "less than the 1s kept for exiting"},
      {-4, 0.01, false, "-4.00s of the grace period remain"},
  };
  for (const Case& c : cases) {
    FinalSaveDecision decision = DecideFinalSave(c.remaining_s, c.estimate_s);
    EXPECT_EQ(decision.save, c.save) << c.remaining_s << " " << c.estimate_s;
    EXPECT_NE(decision.reason.find(c.says), std::string::npos) << decision.reason;
  }
}

}  // namespace
}  // namespace shardckpt
