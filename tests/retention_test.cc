// Retention, the commit window and readers: what a root resolves to after a crash at each commit
// step, keep-last united with keep-best, deletion that never follows a link and never leaves a
// folder that looks committed, and readers that retention never pulls a checkpoint from under.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/background_removal.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/manifest_summary.h"
#include "shardckpt/engine/core/retention.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

template <typename T>
T Or(Result<T> result, T fallback) {
  return result.ok() ? std::move(result).value() : fallback;
}

// ---- The plan, as a table. ----

CheckpointInfo Committed(int64_t step, std::map<std::string, double> metrics = {}) {
  CheckpointInfo c;
  c.name = StepDirName(step);
  c.step = step;
  c.committed = true;
  c.metrics = std::move(metrics);
  return c;
}

std::vector<int64_t> Kept(const RetentionPolicy& policy, const std::string& latest, std::vector<CheckpointInfo> all) {
  PlanRetention(policy, latest, &all);
  std::vector<int64_t> out;
  for (const CheckpointInfo& c : all) {
    if (c.keep) out.push_back(c.step);
  }
  return out;
}

TEST(RetentionPlan, KeepsTheUnionOfLastAndBestAndNeverLatest) {
  std::vector<CheckpointInfo> all = {Committed(10, {{"loss", 0.5}}), Committed(20, {{"loss", 0.2}}),
                                     Committed(30, {{"loss", 0.9}}), Committed(40, {{"loss", 0.1}}),
                                     Committed(50),  // no metric: never best
                                     Committed(60, {{"loss", 3.0}})};
  struct Case {
    RetentionPolicy policy;
    std::string latest;
    std::vector<int64_t> kept;
  } cases[] = {
      {{0, 0, "", false}, "step-000000060", {10, 20, 30, 40, 50, 60}},  // no rule keeps all
      {{1, 0, "", false}, "step-000000060", {60}},
      {{2, 0, "", false}, "step-000000060", {50, 60}},
      {{1, 2, "loss", false}, "step-000000060", {20, 40, 60}},  // latest has the worst loss, kept anyway
      {{1, 2, "loss", true}, "step-000000060", {30, 60}},       // max: 60 is best and last, then 30
      {{0, 1, "loss", false}, "step-000000060", {40, 60}},
      {{1, 1, "loss", false}, "step-000000030", {30, 40, 60}},  // a stale latest and the newest both stay
      {{1, 2, "accuracy", false}, "step-000000060", {60}},      // nobody recorded it: nothing is best
      {{10, 0, "", false}, "step-000000060", {10, 20, 30, 40, 50, 60}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Kept(c.policy, c.latest, all), c.kept)
        << "keep_last " << c.policy.keep_last << " keep_best " << c.policy.keep_best << " " << c.policy.metric;
  }
  // Uncommitted folders are never marked kept (the next save removes them).
  CheckpointInfo temp;
  temp.name = "step-000000070.tmp-0123456789abcdef";
  temp.step = 70;
  temp.temp = true;
  all.push_back(temp);
  EXPECT_EQ(Kept({1, 0, "", false}, "step-000000060", all), std::vector<int64_t>({60}));
}

TEST(RetentionPlan, TiesGoToTheNewerCheckpoint) {
  std::vector<CheckpointInfo> all = {Committed(1, {{"m", 1.0}}), Committed(2, {{"m", 1.0}}), Committed(3, {{"m", 5.0}})};
  EXPECT_EQ(Kept({0, 1, "m", false}, "step-000000003", all), std::vector<int64_t>({2, 3}));
}

// Only folder names a save writes count as its leftovers, to be listed and removed: a user's own
// folders that look alike are left alone.
TEST(RetentionPlan, OnlyNamesASaveWritesAreLeftovers) {
  const std::string id = RandomId();
  struct Row {
    std::string name;
    bool temp, retired;
    int64_t step;
  } rows[] = {
      {TempDirName(7, id), true, false, 7},
      {RetiredDirName(StepDirName(7)), false, true, 7},
      {StepDirName(7), false, false, -1},
      {"step-7.tmp-" + id, false, false, -1},
      {StepDirName(7) + ".tmp-old", false, false, -1},
      {StepDirName(7) + ".tmp-" + id + "x", false, false, -1},
      {StepDirName(7) + ".tmp-0123456789ABCDEF", false, false, -1},
      {StepDirName(7) + ".bak.tmp-" + id, false, false, -1},
      {".removing-step-7-" + id, false, false, -1},
      {".removing-" + StepDirName(7), false, false, -1},
      {".removing-" + StepDirName(7) + ".tmp-" + id, false, false, -1},
      {".removing-notes", false, false, -1},
  };
  for (const Row& r : rows) {
    int64_t step = -1;
    EXPECT_EQ(IsTempDirName(r.name), r.temp) << r.name;
    EXPECT_EQ(IsRetiredDirName(r.name), r.retired) << r.name;
    EXPECT_EQ(ParseLeftoverStepDirName(r.name, &step), r.step >= 0) << r.name;
    if (r.step >= 0) {
      EXPECT_EQ(step, r.step) << r.name;
    }
  }
}

TEST(RetentionPlan, PolicyNeedsAMetricForKeepBest) {
  EXPECT_THAT(ValidatePolicy({0, 2, "", false}).message(), HasSubstr("needs the name of a metric"));
  EXPECT_FALSE(ValidatePolicy({-1, 0, "", false}).ok());
  EXPECT_TRUE(ValidatePolicy({3, 2, "loss", false}).ok());
}

// ---- On disk. ----

class RetentionTest : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }
  std::string StepDir(int64_t step) const { return JoinPath(root(), StepDirName(step)); }
  std::string Latest() const { return ReadLatestName(root()); }

  // A small state whose bytes depend on the step, so a load proves which step it read.
  struct State {
    std::vector<uint8_t> bytes;
    ShardedState state;
    explicit State(int64_t step) : bytes(40000) {
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + step);
      EXPECT_TRUE(state.AddTensor("w", DType::kUInt8, {40000}, Layout::Whole(), bytes.data()).ok());
      EXPECT_TRUE(state.AddBlob("step", std::to_string(step)).ok());
    }
  };

  // Retention of the newest checkpoint and the two with the lowest "loss"; this save records `loss`.
  static SaveOptions KeepLastOneAndBestTwoByLoss(double loss) {
    SaveOptions options;
    options.keep_last = 1;
    options.keep_best = 2;
    options.best_metric = "loss";
    options.metrics["loss"] = loss;
    return options;
  }

  Result<SaveResult> SaveStep(int64_t step, SaveOptions options = {}, Communicator* comm = nullptr) {
    State s(step);
    return Save(comm ? *comm : *comm_, root(), step, s.state, options);
  }

  // Saves `step` while `prune` holds the root for 300 ms more: the save waits for it, not fails.
  void SaveWhilePruneHoldsForAWhile(std::optional<RootLock>* prune, int64_t step) {
    std::thread finishes([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      prune->reset();
    });
    auto t0 = std::chrono::steady_clock::now();
    Result<SaveResult> saved = SaveStep(step);
    const auto waited = std::chrono::steady_clock::now() - t0;
    finishes.join();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_GE(waited, std::chrono::milliseconds(250));
    // Booked as a phase of its own, not as planning.
    auto phase = std::find_if(saved->phases.begin(), saved->phases.end(),
                              [](const PhaseTime& p) { return p.name == "wait_for_prune"; });
    ASSERT_NE(phase, saved->phases.end());
    EXPECT_GE(phase->seconds, 0.2);
    EXPECT_EQ((phase + 1)->name, "plan");
    EXPECT_LT((phase + 1)->seconds, 0.2);
  }

  // Loads `path` and returns the step whose bytes it holds (after checking they match it).
  Result<int64_t> LoadStep(const std::string& path, Communicator* comm = nullptr) {
    std::vector<uint8_t> got(40000, 0xAB);
    ShardedState targets;
    SC_RETURN_IF_ERROR(targets.AddTensor("w", DType::kUInt8, {40000}, Layout::Whole(), got.data()));
    SC_ASSIGN_OR_RETURN(LoadReport report, Load(comm ? *comm : *comm_, path, targets));
    State expected(report.step);
    if (got != expected.bytes) return DataLoss("bytes of step " + std::to_string(report.step) + " differ");
    if (report.blobs.at("step").bytes != std::to_string(report.step)) return DataLoss("blob 'step' differs");
    return report.step;
  }

  // Runs `body` in a child process (which may die at a failpoint); returns its wait status.
  int InChild(const std::function<void()>& body) {
    pid_t pid = ::fork();
    if (pid == 0) {
      body();
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names = ListDir(root()).value();
    std::vector<std::string> out;
    for (const std::string& n : names) {
      if (n.rfind("step-", 0) == 0) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
};

// Issue 11 item 4: a crash at any commit step, the rename of step-N and the replacement of
// `latest` included, leaves a root that resolves to a complete checkpoint, that a resumed run
// loads, and that the next save (of the next step) commits into without anyone's help.
TEST_F(RetentionTest, ACrashAtEachCommitStepLeavesARootThatResumesAndSavesOn) {
  const char* steps[] = {"commit.manifest.write", "commit.manifest.fsync", "commit.sync_tmp",
                         "commit.rename_dir",     "commit.sync_root",      "commit.latest.write",
                         "commit.latest.fsync",   "commit.latest.rename",  "commit.latest.sync_dir"};
  ASSERT_TRUE(SaveStep(1).ok());
  int64_t step = 2;
  int renamed = 0;
  for (const char* failpoint : steps) {
    int status = InChild([&] {
      SetFailpoints(std::string(failpoint) + "=kill").IgnoreError();
      SaveStep(step).status().IgnoreError();
    });
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << failpoint << " did not kill the save";
    // The save died before or after its rename: the root resolves to the newest complete one.
    const bool committed = PathExists(JoinPath(StepDir(step), kManifestName));
    renamed += committed;
    Result<int64_t> resumed = LoadStep(root());
    ASSERT_TRUE(resumed.ok()) << failpoint << ": " << resumed.status().ToString();
    const int64_t previous = step - 1;
    EXPECT_EQ(*resumed, committed ? step : previous) << failpoint;
    // The resumed run saves its next step: no "already committed", `latest` repaired.
    const int64_t next = committed ? step + 1 : step;
    Result<SaveResult> saved = SaveStep(next);
    ASSERT_TRUE(saved.ok()) << failpoint << ": " << saved.status().ToString();
    EXPECT_EQ(Latest(), StepDirName(next)) << failpoint;
    EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), next) << failpoint;
    for (const std::string& name : Names()) {
      EXPECT_FALSE(IsTempDirName(name)) << failpoint << " left " << name;
      EXPECT_NE(name, std::string(kLatestName) + ".tmp") << failpoint;  // the dead save's, replaced and published
    }
    step = next + 1;
  }
  // The window this is about was hit: some kills came after the rename, before `latest`'s
  // (sync_root, latest.rename, latest.sync_dir: its temp file was written before the rename).
  EXPECT_GE(renamed, 3);
}

TEST_F(RetentionTest, ARootWithoutLatestResolvesToItsNewestCommittedCheckpoint) {
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  ASSERT_EQ(::unlink(JoinPath(root(), kLatestName).c_str()), 0);
  EXPECT_EQ(Or(ResolveCheckpoint(root()), std::string()), StepDir(2));
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 2);
  // A `latest` naming an older one is stale: the newest committed wins, the next save repairs it.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root(), kLatestName), "step-000000001\n", "test").ok());
  EXPECT_EQ(Or(ResolveCheckpoint(root()), std::string()), StepDir(2));
  ASSERT_TRUE(SaveStep(3).ok());
  EXPECT_EQ(Latest(), "step-000000003");
  // A folder with neither is NotFound, saying so.
  ASSERT_TRUE(MakeDirs(JoinPath(dir_.path(), "empty")).ok());
  Result<std::string> none = ResolveCheckpoint(JoinPath(dir_.path(), "empty"));
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("neither a checkpoint"));
  // A root whose first save has not committed (running, or dead): said so, not "neither".
  ASSERT_TRUE(MakeDirs(JoinPath(JoinPath(dir_.path(), "first"), StepDirName(1) + ".tmp-0123456789abcdef")).ok());
  Result<std::string> first = ResolveCheckpoint(JoinPath(dir_.path(), "first"));
  EXPECT_EQ(first.status().code(), Code::kNotFound);
  EXPECT_THAT(first.status().message(), HasSubstr("is a root with no committed checkpoint yet"));
  // DCP data files without their .metadata: named as an incomplete DCP folder.
  const std::string dcp = JoinPath(dir_.path(), "dcp");
  ASSERT_TRUE(MakeDirs(dcp).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dcp, "__0_0.distcp"), "x", "test").ok());
  Result<std::string> partial = ResolveCheckpoint(dcp);
  EXPECT_EQ(partial.status().code(), Code::kNotFound);
  EXPECT_THAT(partial.status().message(), HasSubstr(dcp + " holds PyTorch DCP data files (*.distcp) but no .metadata"));
}

// A save's temporary folder holds its whole manifest just before the rename that commits it (a
// save killed there leaves it so), and a retired folder is a checkpoint being deleted: named
// directly, neither is read as a checkpoint (verify called one OK, and consolidate and load read it).
TEST_F(RetentionTest, ATemporaryOrRetiredFolderNamedDirectlyIsNotACheckpoint) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string temp = JoinPath(root(), StepDirName(2) + ".tmp-0123456789abcdef");
  const std::string retired = JoinPath(root(), RetiredDirName(StepDirName(1)));
  for (const std::string& folder : {temp, retired}) {
    ASSERT_TRUE(MakeDirs(folder).ok());
    Result<std::string> manifest = ReadFileLimited(JoinPath(StepDir(1), kManifestName), 1u << 20);
    ASSERT_TRUE(manifest.ok());
    ASSERT_TRUE(WriteFileAtomic(JoinPath(folder, kManifestName), *manifest, "test").ok());
    const std::string link = JoinPath(dir_.path(), "link-to-" + BaseName(folder));
    ASSERT_EQ(::symlink(folder.c_str(), link.c_str()), 0);
    for (const std::string& named : {folder, folder + "/", folder + "/.", link}) {
      Result<std::string> resolved = ResolveCheckpoint(named);
      EXPECT_EQ(resolved.status().code(), Code::kFailedPrecondition) << named;
      EXPECT_THAT(resolved.status().message(), HasSubstr(named + " is ")) << named;
      EXPECT_THAT(resolved.status().message(), HasSubstr("not a committed checkpoint: `shardckpt list " + root() + "`"));
    }
  }
  EXPECT_THAT(ResolveCheckpoint(temp).status().message(), HasSubstr("the temporary folder of a save that is running or died"));
  EXPECT_THAT(ResolveCheckpoint(retired).status().message(), HasSubstr("a checkpoint being deleted"));
  EXPECT_EQ(Or(ResolveCheckpoint(root()), std::string()), StepDir(1));  // the root still resolves
  // A link named like a temporary folder that leads to a committed one is that checkpoint.
  const std::string odd_link = JoinPath(dir_.path(), StepDirName(1) + ".tmp-fedcba9876543210");
  ASSERT_EQ(::symlink(StepDir(1).c_str(), odd_link.c_str()), 0);
  EXPECT_EQ(Or(ResolveCheckpoint(odd_link), std::string()), odd_link);
}

// A listing is a snapshot: a save that renames its new step in after a reader listed the root
// and then retires the listed one leaves the reader with nothing committed. The root is listed
// again while `latest` exists; only when nothing committed appears is it NotFound, saying so.
TEST_F(RetentionTest, ARootWithLatestAndNothingCommittedIsListedAgainBeforeNotFound) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string aside = JoinPath(dir_.path(), "aside");
  ASSERT_EQ(::rename(StepDir(1).c_str(), aside.c_str()), 0);
  Result<std::string> none = ResolveCheckpoint(root());
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("latest names 'step-000000001', but"));
  EXPECT_THAT(none.status().message(), HasSubstr("holds no committed checkpoint"));
  // A NUL byte in `latest` is shown, not where the message stops.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root(), kLatestName), std::string("step-000000001\0x\n", 17), "test").ok());
  EXPECT_THAT(ResolveCheckpoint(root()).status().message(),
              HasSubstr("latest names 'step-000000001\\0x', but " + root() + " holds no committed checkpoint"));
  // The step appears while the reader is listing again (as a save's rename would).
  std::thread saver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(::rename(aside.c_str(), StepDir(1).c_str()), 0);
  });
  Result<std::string> found = ResolveCheckpoint(root());
  saver.join();
  EXPECT_EQ(Or(found, std::string()), StepDir(1)) << found.status().ToString();
}

// ---- Metrics and keep-best. ----

TEST_F(RetentionTest, MetricsAreRecordedTypedAndValidated) {
  SaveOptions options;
  options.metrics = {{"val_loss", 0.125}, {"accuracy", 97.5}};
  ASSERT_TRUE(SaveStep(1, options).ok());
  Manifest m = ReadManifest(StepDir(1)).value();
  EXPECT_EQ(m.metrics, options.metrics);
  std::string text = ReadFileLimited(JoinPath(StepDir(1), kManifestName), 1 << 20).value();
  EXPECT_THAT(text, HasSubstr("\"val_loss\": 0.125"));  // a JSON number, not a string
  // Not a finite number (a diverged step's loss): left out, the checkpoint saved without it.
  options.metrics = {{"val_loss", std::nan("")}, {"accuracy", 12.5}};
  Result<SaveResult> diverged = SaveStep(2, options);
  ASSERT_TRUE(diverged.ok()) << diverged.status().ToString();
  EXPECT_EQ(ReadManifest(StepDir(2)).value().metrics, (std::map<std::string, double>{{"accuracy", 12.5}}));
  // A manifest whose metric is not a number is refused on read, naming it (seal recomputed, so
  // only the type check can catch it).
  Manifest edited = m;
  std::string encoded = EncodeManifest(edited).value();
  std::string bodyless = CheckSeal(encoded, "x").value();
  size_t at = bodyless.find("0.125");
  ASSERT_NE(at, std::string::npos);
  bodyless.replace(at, 5, "\"low\"");
  Result<Manifest> decoded = DecodeManifest(SealManifestText(bodyless), "m.json");
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(), HasSubstr("metric 'val_loss' is string, not a number"));
}

// A retention rule that cannot be applied is refused before anything is written, naming what is
// wrong, instead of a save that commits and then warns that its retention failed (every save of
// a run, which then never removes anything).
TEST_F(RetentionTest, ABadRetentionRuleOrMetricFailsTheSaveBeforeItWrites) {
  SaveOptions negative;
  negative.keep_last = -1;
  SaveOptions nameless;
  nameless.keep_last = 1;
  nameless.keep_best = 2;
  struct Case {
    SaveOptions options;
    const char* error;
  } cases[] = {{negative, "must not be negative"}, {nameless, "keep_best needs the name of a metric"}};
  for (const Case& c : cases) {
    // The data write would fail too: the rule is what the error names, so it was checked first.
    SetFailpoints("save.write_data=EIO").IgnoreError();
    Result<SaveResult> saved = SaveStep(1, c.options);
    SetFailpoints("").IgnoreError();
    ASSERT_FALSE(saved.ok()) << c.error;
    EXPECT_EQ(saved.status().code(), Code::kInvalidArgument) << saved.status().ToString();
    EXPECT_THAT(saved.status().message(), HasSubstr(c.error));
    EXPECT_FALSE(PathExists(root())) << c.error << ": the save wrote before refusing";
  }
}

TEST_F(RetentionTest, KeepLastOneAndBestTwoEndsWithTheNewestAndTheTwoLowest) {
  const std::map<int64_t, double> loss = {{10, 0.9}, {20, 0.3}, {30, 0.5}, {40, 0.2}, {50, 0.4}, {60, 0.8}};
  for (const auto& [step, value] : loss) {
    ASSERT_TRUE(SaveStep(step, KeepLastOneAndBestTwoByLoss(value)).ok()) << step;
  }
  EXPECT_THAT(Names(), ElementsAre(StepDirName(20), StepDirName(40), StepDirName(60)));
  // `latest` is never removed, even with the worst metric of all.
  ASSERT_TRUE(SaveStep(70, KeepLastOneAndBestTwoByLoss(99.0)).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(20), StepDirName(40), StepDirName(70)));
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 70);
  // Dry run lists without removing.
  Result<RetentionReport> dry = ApplyRetention(root(), {1, 0, "", false}, "", true);
  ASSERT_TRUE(dry.ok());
  EXPECT_THAT(dry->removed, ElementsAre(StepDirName(20), StepDirName(40)));
  EXPECT_THAT(Names(), ElementsAre(StepDirName(20), StepDirName(40), StepDirName(70)));
}

// A misspelt metric would make nothing best, and keep_last 1 would then remove the best
// checkpoint: the save commits, and retention removes nothing until some checkpoint records it.
TEST_F(RetentionTest, AMetricNoCheckpointRecordsRemovesNothing) {
  for (const auto& [step, value] : std::map<int64_t, double>{{10, 0.1}, {20, 0.5}, {30, 0.6}}) {
    SaveOptions options;
    options.metrics["val_loss"] = value;
    ASSERT_TRUE(SaveStep(step, options).ok()) << step;
  }
  SaveOptions misspelt = KeepLastOneAndBestTwoByLoss(0.9);
  misspelt.best_metric = "vall_loss";
  misspelt.metrics = {{"val_loss", 0.9}};
  ASSERT_TRUE(SaveStep(40, misspelt).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(10), StepDirName(20), StepDirName(30), StepDirName(40)));
  Result<RetentionReport> applied = ApplyRetention(root(), misspelt.retention(), "");
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().ToString(), "InvalidArgument: no checkpoint in " + root() +
                                             " records the metric 'vall_loss' (recorded: val_loss): keep-best by it would "
                                             "keep none of them, so the rule is refused");
  // Spelt right, the best (step 10) and the newest stay.
  misspelt.best_metric = "val_loss";
  misspelt.keep_best = 1;
  ASSERT_TRUE(SaveStep(50, misspelt).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(10), StepDirName(50)));
}

// Saves before a run's first evaluation record no metric: nothing could rank as best even with
// the metric spelt right, so keep_last applies; once one checkpoint records it, the best stays.
// `prune` (a person's command) still refuses while nothing records it.
TEST_F(RetentionTest, SavesBeforeAnyMetricIsRecordedApplyKeepLast) {
  SaveOptions policy = KeepLastOneAndBestTwoByLoss(0);
  policy.metrics.clear();
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(SaveStep(step, policy).ok()) << step;
  EXPECT_THAT(Names(), ElementsAre(StepDirName(30)));
  Result<std::vector<CheckpointInfo>> all = ListCheckpoints(root());
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(CheckMetricRecorded(policy.retention(), root(), *all).ok());
  policy.metrics = {{"loss", 0.1}};
  ASSERT_TRUE(SaveStep(40, policy).ok());
  policy.metrics = {{"loss", 0.7}};
  ASSERT_TRUE(SaveStep(50, policy).ok());
  policy.metrics.clear();
  ASSERT_TRUE(SaveStep(60, policy).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(40), StepDirName(50), StepDirName(60)));
}

// A resharded checkpoint keeps its source's metrics: `list` shows them and keep-best ranks it.
TEST_F(RetentionTest, AReshardKeepsTheMetrics) {
  SaveOptions options;
  options.metrics = {{"loss", 0.25}, {"val_loss", 0.5}};
  ASSERT_TRUE(SaveStep(10, options).ok());
  ConvertOptions to_three;
  to_three.world_size = 3;
  const std::string resharded = JoinPath(dir_.path(), "r3");
  ASSERT_TRUE(Reshard(root(), resharded, to_three).ok());
  Result<Manifest> m = ReadManifest(JoinPath(resharded, StepDirName(10)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world_size, 3);
  EXPECT_EQ(m->metrics, options.metrics);
}

// Every save with keep_best ranks every committed checkpoint of its root by the metric. The
// manifests are not decoded for that again and again (manifest_summary.h): a save remembers what
// it committed, and a manifest read once is read again only when the file is another.
TEST_F(RetentionTest, SavesThatKeepTheBestDecodeNoManifestTheyCommitted) {
  const std::map<int64_t, double> loss = {{10, 0.9}, {20, 0.3}, {30, 0.5}, {40, 0.2}, {50, 0.4}, {60, 0.8}};
  SavePlanCache plan_cache;  // repeat saves publish a kept manifest: their summaries too
  const uint64_t decodes = ManifestSummaryDecodes();
  const size_t remembered = ManifestSummariesRemembered();
  for (const auto& [step, value] : loss) {
    SaveOptions options = KeepLastOneAndBestTwoByLoss(value);
    if (step > 30) options.plan_cache = &plan_cache;
    ASSERT_TRUE(SaveStep(step, options).ok()) << step;
  }
  EXPECT_THAT(Names(), ElementsAre(StepDirName(20), StepDirName(40), StepDirName(60)));
  EXPECT_EQ(ManifestSummaryDecodes(), decodes);
  WaitForBackgroundRemovals();  // the retired folders, listed until their files are gone
  std::vector<CheckpointInfo> listed = ListCheckpoints(root()).value();
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[1].metrics, (std::map<std::string, double>{{"loss", 0.2}}));
  EXPECT_EQ(listed[2].world_size, 1);
  EXPECT_EQ(listed[2].time, ReadManifest(StepDir(60)).value().created.time);
  EXPECT_EQ(ManifestSummaryDecodes(), decodes);
  // What retention removed is forgotten: the process remembers the checkpoints kept.
  EXPECT_EQ(ManifestSummariesRemembered(), remembered + 3);
}

// keep_last alone checks the newest checkpoints for damage: from what the commits remembered,
// never by decoding a manifest the job wrote itself (0.2 s at 3 million chunks).
TEST_F(RetentionTest, SavesThatKeepTheLastDecodeNoManifestTheyCommitted) {
  const uint64_t decodes = ManifestSummaryDecodes();
  SaveOptions options;
  options.keep_last = 2;
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(SaveStep(step, options).ok()) << step;
  WaitForBackgroundRemovals();
  EXPECT_THAT(Names(), ElementsAre(StepDirName(4), StepDirName(5)));
  EXPECT_EQ(ManifestSummaryDecodes(), decodes);
}

TEST_F(RetentionTest, AManifestReplacedUnderTheSamePathIsDecodedAgainOnce) {
  ASSERT_TRUE(SaveStep(1, KeepLastOneAndBestTwoByLoss(0.5)).ok());  // both kept, both remembered
  ASSERT_TRUE(SaveStep(2, KeepLastOneAndBestTwoByLoss(0.5)).ok());
  // Another manifest for step 1, with another metric, written as a new file (a copy restored by
  // hand, an older writer): the summary follows the file, not the path.
  Manifest m = ReadManifest(StepDir(1)).value();
  m.metrics["loss"] = 0.7;  // the same length: a file of the same size
  const std::string path = JoinPath(StepDir(1), kManifestName);
  const uint64_t size = FileSize(path).value();
  ASSERT_TRUE(WriteFileAtomic(path, EncodeManifest(m).value(), "test.manifest").ok());
  ASSERT_EQ(FileSize(path).value(), size);
  const uint64_t decodes = ManifestSummaryDecodes();
  std::vector<CheckpointInfo> listed = ListCheckpoints(root()).value();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].metrics.at("loss"), 0.7);
  EXPECT_EQ(listed[1].metrics.at("loss"), 0.5);
  EXPECT_EQ(ManifestSummaryDecodes(), decodes + 1);
  ASSERT_TRUE(ListCheckpoints(root()).ok());
  EXPECT_EQ(ManifestSummaryDecodes(), decodes + 1);
  // Rewritten in place, same inode and size: its times tell (the pause outlasts their grain).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  m.metrics["loss"] = 0.3;
  {
    const std::string text = EncodeManifest(m).value();
    ASSERT_EQ(text.size(), size);
    FILE* f = std::fopen(path.c_str(), "r+");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
    ASSERT_EQ(std::fclose(f), 0);
  }
  listed = ListCheckpoints(root()).value();
  EXPECT_EQ(listed[0].metrics.at("loss"), 0.3);
  EXPECT_EQ(ManifestSummaryDecodes(), decodes + 2);
  // A manifest damaged after it was remembered is a problem again, named, without metrics.
  std::string text = ReadFileLimited(JoinPath(StepDir(1), kManifestName), 1 << 20).value();
  text[text.size() / 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomic(JoinPath(StepDir(1), kManifestName), text, "test.manifest").ok());
  listed = ListCheckpoints(root()).value();
  EXPECT_THAT(listed[0].problem, HasSubstr(JoinPath(StepDir(1), kManifestName)));
  EXPECT_TRUE(listed[0].metrics.empty());
}

// A folder renamed to another step's name verifies (its bytes are sound) with a note saying so:
// a root takes it for the step of its name.
TEST_F(RetentionTest, VerifyNotesAFolderNamedForAnotherStep) {
  ASSERT_TRUE(SaveStep(1).ok());
  Result<VerifyReport> plain = VerifyCheckpoint(StepDir(1));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->note, "");
  ASSERT_EQ(::rename(StepDir(1).c_str(), StepDir(50).c_str()), 0);
  Result<VerifyReport> renamed = VerifyCheckpoint(StepDir(50));
  ASSERT_TRUE(renamed.ok()) << renamed.status().ToString();
  EXPECT_TRUE(renamed->problems.empty());
  EXPECT_EQ(renamed->note, "the folder is named " + StepDirName(50) +
                               " but its manifest is of step 1 (renamed?): a root takes it for step 50");
  Result<VerifyReport> slash = VerifyCheckpoint(StepDir(50) + "/");
  ASSERT_TRUE(slash.ok());
  EXPECT_EQ(slash->note, renamed->note);
}

TEST_F(RetentionTest, ARememberedCheckpointWithAMissingOrTruncatedDataFileIsAProblem) {
  SaveOptions options;
  options.metrics["loss"] = 0.1;
  ASSERT_TRUE(SaveStep(1, options).ok());
  options.metrics["loss"] = 0.5;
  ASSERT_TRUE(SaveStep(2, options).ok());
  options.metrics["loss"] = 0.9;
  ASSERT_TRUE(SaveStep(3, options).ok());
  const std::string data = JoinPath(StepDir(1), RankFileName(0));
  ASSERT_EQ(::truncate(data.c_str(), 4096), 0);
  std::vector<CheckpointInfo> listed = ListCheckpoints(root()).value();
  EXPECT_THAT(listed[0].problem, HasSubstr("data file 'rank-00000.bin' is 4096 bytes"));
  EXPECT_THAT(listed[0].problem, HasSubstr("(truncated)"));
  // Its manifest reads: `list` still shows which run and step it was.
  EXPECT_EQ(listed[0].metrics.at("loss"), 0.1);
  EXPECT_EQ(listed[0].world_size, 1);
  EXPECT_FALSE(listed[0].time.empty());
  ASSERT_EQ(::unlink(data.c_str()), 0);
  listed = ListCheckpoints(root()).value();
  EXPECT_THAT(listed[0].problem, HasSubstr("data file 'rank-00000.bin' is missing"));
  EXPECT_THAT(listed[0].problem, HasSubstr(StepDir(1)));
  EXPECT_EQ(listed[1].metrics.at("loss"), 0.5);
  EXPECT_TRUE(listed[1].problem.empty());
  // The damaged checkpoint has the best loss but is never kept as the best: step 2 is.
  RetentionPolicy policy;
  policy.keep_last = 1;
  policy.keep_best = 1;
  policy.metric = "loss";
  PlanRetention(policy, ReadLatestName(root()), &listed);
  EXPECT_FALSE(listed[0].keep);
  EXPECT_TRUE(listed[1].keep);
  EXPECT_THAT(listed[1].why, HasSubstr("best 1 by loss"));
  // keep_last counts the checkpoints that are not damaged: with the newest damaged too, the
  // newest sound one is kept beside it, and the root still holds one that loads.
  listed[2].problem = "manifest.json: not a shardckpt manifest";
  policy.keep_best = 0;
  PlanRetention(policy, ReadLatestName(root()), &listed);
  EXPECT_FALSE(listed[0].keep);
  EXPECT_TRUE(listed[1].keep);
  EXPECT_EQ(listed[1].why, "last 1");
  EXPECT_TRUE(listed[2].keep);
  EXPECT_THAT(listed[2].why, HasSubstr("latest"));
}

// A save stopped between its folder's rename and `latest`: `latest` names an older step, while
// readers resolve the root to the newest. The dry run kept the step `latest` named and the real
// prune (which mends `latest` first) removed it: both now keep what readers use.
TEST_F(RetentionTest, AStaleLatestIsPlannedAsReadersResolveIt) {
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveStep(step).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root(), kLatestName), StepDirName(1) + "\n", "test").ok());
  EXPECT_EQ(NewestCommitted(ListCheckpoints(root(), false, false).value()), StepDirName(3));
  EXPECT_EQ(ReadLatestName(root()), StepDirName(1));
  RetentionPolicy policy;
  policy.keep_last = 1;
  RetentionReport dry = ApplyRetention(root(), policy, "", /*dry_run=*/true).value();
  EXPECT_EQ(dry.removed, (std::vector<std::string>{StepDirName(1), StepDirName(2)}));
  ASSERT_TRUE(RepairLatest(root()).ok());  // as prune does before it applies the rule
  RetentionReport pruned = ApplyRetention(root(), policy, "", /*dry_run=*/false).value();
  EXPECT_EQ(pruned.removed, dry.removed);
  EXPECT_EQ(Names(), std::vector<std::string>{StepDirName(3)});
}

// A folder named `latest` (someone's mkdir) failed every save at its last step, the rename of
// latest.tmp over it, after the data was written. The save is refused before it writes, naming it.
TEST_F(RetentionTest, AFolderNamedLatestFailsTheSaveBeforeItWrites) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string latest = JoinPath(root(), kLatestName);
  ASSERT_EQ(::unlink(latest.c_str()), 0);
  ASSERT_TRUE(MakeDir(latest).ok());
  Result<SaveResult> saved = SaveStep(2);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(saved.status().message(), HasSubstr(latest + " is a folder"));
  EXPECT_EQ(Names(), std::vector<std::string>{StepDirName(1)});  // nothing written, nothing lost
  EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(2))));
  EXPECT_THAT(CheckLatestIsNoFolder(root()).message(), HasSubstr(latest + " is a folder"));
  // A reader says the folder as such (it said `latest` did not name the newest, "or it was edited").
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(LoadStep(root()).value(), 1);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, HasSubstr(latest + " is a folder, where shardckpt keeps the file that names the newest checkpoint; "
                                       "reading the newest committed one, " + StepDirName(1)));
  EXPECT_THAT(said, Not(HasSubstr("does not name the newest")));
  ASSERT_EQ(::rmdir(latest.c_str()), 0);
  ASSERT_TRUE(SaveStep(2).ok());
  EXPECT_EQ(Latest(), StepDirName(2));
}

// The same on disk, as `prune --keep-last 1` and a save's keep_last apply it (no metric ranked,
// so only the newest manifests are read): it removed the only checkpoint that loaded.
TEST_F(RetentionTest, KeepLastWithTheNewestDamagedKeepsTheNewestThatLoads) {
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveStep(step).ok());
  const std::string manifest = JoinPath(StepDir(3), kManifestName);
  std::string bytes = ReadFileLimited(manifest, 1 << 20).value();
  bytes[bytes.size() / 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomic(manifest, bytes, "test").ok());
  RetentionPolicy policy;
  policy.keep_last = 1;
  RetentionReport dry = ApplyRetention(root(), policy, "", /*dry_run=*/true).value();
  EXPECT_EQ(dry.removed, std::vector<std::string>{StepDirName(1)});
  RetentionReport pruned = ApplyRetention(root(), policy, "", /*dry_run=*/false).value();
  EXPECT_EQ(pruned.removed, std::vector<std::string>{StepDirName(1)});
  EXPECT_EQ(Names(), (std::vector<std::string>{StepDirName(2), StepDirName(3)}));
  EXPECT_EQ(LoadStep(StepDir(2)).value(), 2);
  // A save's own retention: step 4 committed with keep_last 1, the damaged step 3 is now no
  // newest and goes with step 2, the sound one below step 4.
  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(4, options).ok());
  EXPECT_EQ(Names(), std::vector<std::string>{StepDirName(4)});
}

// A checkpoint whose manifest cannot be read for a reason that is not damage (a permission
// changed, EIO, ESTALE; here a folder in its place, which refuses root too) is not known to be
// damaged: retention keeps it, where it deleted the intact data files with it.
TEST_F(RetentionTest, ACheckpointThatCannotBeReadIsKeptNotRemovedAsDamaged) {
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveStep(step).ok());
  const std::string manifest = JoinPath(StepDir(2), kManifestName);
  ASSERT_EQ(::unlink(manifest.c_str()), 0);
  ASSERT_TRUE(MakeDirs(manifest).ok());
  RetentionPolicy policy;
  policy.keep_last = 1;
  // Step 2 lies outside keep_last's window, where keep_last alone reads no manifest: it is read
  // before it would be removed, and kept (not a removal that failed).
  RetentionReport pruned = ApplyRetention(root(), policy, "", /*dry_run=*/false).value();
  EXPECT_EQ(pruned.removed, std::vector<std::string>{StepDirName(1)});
  ASSERT_EQ(pruned.failed.size(), 1u);  // named as left on purpose (prune --json: left_alone)
  EXPECT_TRUE(pruned.failed[0].on_purpose);
  EXPECT_EQ(pruned.failed[0].name, StepDirName(2));
  EXPECT_THAT(pruned.failed[0].status.message(), HasSubstr(" is kept: "));
  EXPECT_THAT(pruned.failed[0].status.message(), HasSubstr("(unreadable, not known to be damaged)"));
  EXPECT_EQ(Names(), (std::vector<std::string>{StepDirName(2), StepDirName(3)}));
  std::vector<CheckpointInfo> all = ListCheckpoints(root(), /*with_manifests=*/true, false).value();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].unreadable);
  PlanRetention(policy, StepDirName(3), &all);
  EXPECT_TRUE(all[0].keep);
  EXPECT_EQ(all[0].why, "unreadable, not known to be damaged");
}

// ---- Deletion: links, crashes, readers. ----

// A step folder linked in from an archive that is not mounted now (and a manifest.json that is
// such a link): no save leaves either, so the cleanup leaves them, `list` says why, and the
// root is refused rather than read at the older step (a resume went back two steps and its next
// save deleted the link). With the archive back, the root reads the linked step again.
TEST_F(RetentionTest, AStepFolderThatCannotBeReachedIsLeftAndTheRootRefused) {
  ASSERT_TRUE(SaveStep(2).ok());
  const std::string archive = JoinPath(dir_.path(), "archive"), away = JoinPath(dir_.path(), "archive.off");
  ASSERT_TRUE(Save(*comm_, archive, 4, State(4).state).ok());
  ASSERT_EQ(::symlink(JoinPath(archive, StepDirName(4)).c_str(), StepDir(4).c_str()), 0);
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 4);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root(), kLatestName), StepDirName(4) + "\n", "test").ok());
  ASSERT_EQ(::rename(archive.c_str(), away.c_str()), 0);  // "unmounted"
  // Still a root of checkpoints (a new run must not be mixed in); `latest` is not turned back;
  // a save of an earlier step is refused as it would be beside step 4 itself.
  EXPECT_TRUE(HoldsCheckpoints(root()));
  ASSERT_TRUE(RepairLatest(root()).ok());
  EXPECT_EQ(Latest(), StepDirName(4));
  Result<SaveResult> earlier = SaveStep(3);
  ASSERT_FALSE(earlier.ok());
  EXPECT_THAT(earlier.status().message(), HasSubstr("step 3 is earlier than " + StepDirName(4)));
  EXPECT_THAT(earlier.status().message(), HasSubstr("which cannot be reached"));
  Result<std::string> resolved = ResolveCheckpoint(root());
  ASSERT_FALSE(resolved.ok());
  EXPECT_EQ(resolved.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(resolved.status().message(),
              HasSubstr(StepDir(4) + ", newer than " + StepDirName(2) + ", is a link to " + JoinPath(archive, StepDirName(4)) +
                        ", which cannot be reached"));
  // Named directly, the folder is said to be such a link (it said "does not exist"), with a
  // trailing slash too; a path that is simply not there still does not exist.
  for (const std::string& named : {StepDir(4), StepDir(4) + "/"}) {
    Result<std::string> direct = ResolveCheckpoint(named);
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.status().code(), Code::kFailedPrecondition);
    EXPECT_THAT(direct.status().message(),
                HasSubstr(named + " is a link to " + JoinPath(archive, StepDirName(4)) + ", which cannot be reached"));
  }
  for (const std::string& absent : {JoinPath(root(), "nothing"), JoinPath(root(), std::string(300, 'a'))}) {
    Result<std::string> none = ResolveCheckpoint(absent);
    EXPECT_EQ(none.status().code(), Code::kNotFound) << none.status().ToString();
    EXPECT_THAT(none.status().message(), HasSubstr(absent + " does not exist"));
  }
  std::vector<std::string> removed;
  std::vector<RemovalFailure> failed;
  ASSERT_TRUE(RemoveStaleTempDirs(root(), &removed, nullptr, &failed).ok());
  EXPECT_TRUE(removed.empty());
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(failed[0].status.message(), HasSubstr("left as it is (no save leaves that)"));
  std::vector<CheckpointInfo> all = ListCheckpoints(root(), true, false).value();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_THAT(all[1].unreachable, HasSubstr("which cannot be reached"));
  // A save of the next step leaves it too.
  ASSERT_TRUE(SaveStep(6).ok());
  struct stat st {};
  EXPECT_EQ(::lstat(StepDir(4).c_str(), &st), 0);
  ASSERT_EQ(::rename(away.c_str(), archive.c_str()), 0);
  EXPECT_EQ(Or(LoadStep(StepDir(4)), int64_t{-1}), 4);

  // A manifest.json that is a link to nothing: the same.
  ASSERT_TRUE(SaveStep(8).ok());
  const std::string manifest = JoinPath(StepDir(8), kManifestName);
  ASSERT_EQ(::unlink(manifest.c_str()), 0);
  ASSERT_EQ(::symlink(JoinPath(away, "manifest.json").c_str(), manifest.c_str()), 0);
  resolved = ResolveCheckpoint(root());
  ASSERT_FALSE(resolved.ok());
  EXPECT_THAT(resolved.status().message(), HasSubstr("is a folder whose manifest.json is a link to"));
  failed.clear();
  ASSERT_TRUE(RemoveStaleTempDirs(root(), nullptr, nullptr, &failed).ok());
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_TRUE(PathExists(JoinPath(StepDir(8), RankFileName(0))));
}

TEST_F(RetentionTest, RetentionNeverFollowsALinkOutOfTheRoot) {
  // An archived checkpoint linked in as the oldest step, a rank file of another step linked to
  // a file outside, and a dead save's temp folder that is a link.
  const std::string archive = JoinPath(dir_.path(), "archive");
  ASSERT_TRUE(Save(*comm_, archive, 1, State(1).state).ok());
  ASSERT_TRUE(MakeDirs(root()).ok());
  ASSERT_EQ(::symlink(JoinPath(archive, StepDirName(1)).c_str(), StepDir(1).c_str()), 0);
  ASSERT_TRUE(SaveStep(2).ok());
  const std::string outside_file = JoinPath(dir_.path(), "outside.bin");
  ASSERT_TRUE(WriteFileAtomic(outside_file, "precious", "test").ok());
  ASSERT_EQ(::symlink(outside_file.c_str(), JoinPath(StepDir(2), "extra.bin").c_str()), 0);
  const std::string outside_dir = JoinPath(dir_.path(), "outside-dir");
  ASSERT_TRUE(MakeDirs(outside_dir).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(outside_dir, "keep.me"), "x", "test").ok());
  ASSERT_EQ(::symlink(outside_dir.c_str(), JoinPath(root(), "step-000000005.tmp-00000000deaddead").c_str()), 0);

  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(3, options).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(3)));
  // Everything outside the root is whole: the archived checkpoint still loads.
  EXPECT_TRUE(PathExists(JoinPath(JoinPath(archive, StepDirName(1)), kManifestName)));
  EXPECT_EQ(Or(LoadStep(JoinPath(archive, StepDirName(1))), int64_t{-1}), 1);
  EXPECT_EQ(Or(ReadFileLimited(outside_file, 100), std::string()), "precious");
  EXPECT_TRUE(PathExists(JoinPath(outside_dir, "keep.me")));
}

TEST_F(RetentionTest, AKilledPruneLeavesFoldersCompleteOrWithoutManifestAndTheNextSaveCleansThem) {
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(SaveStep(step).ok());
  for (const char* failpoint : {"retention.remove_tree#2=kill", "retention.remove#2=kill"}) {
    int status = InChild([&] {
      SetFailpoints(failpoint).IgnoreError();
      ApplyRetention(root(), {1, 0, "", false}, "").status().IgnoreError();
    });
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << failpoint;
  }
  int without_manifest = 0;
  for (const std::string& name : Names()) {
    const std::string dir = JoinPath(root(), name);
    if (!PathExists(JoinPath(dir, kManifestName))) {
      ++without_manifest;
      continue;
    }
    Result<VerifyReport> report = VerifyCheckpoint(dir);
    ASSERT_TRUE(report.ok()) << name;
    EXPECT_TRUE(report->problems.empty()) << name << " is committed but not complete";
  }
  EXPECT_GE(without_manifest, 1);
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 5);
  ASSERT_TRUE(SaveStep(6).ok());
  for (const std::string& name : Names()) EXPECT_TRUE(PathExists(JoinPath(JoinPath(root(), name), kManifestName))) << name;
}

// A step folder without a manifest is a cut-short deletion's leftover only while it holds what
// saves write: one with other files (an rsync into the root in progress, someone's notes) is
// left with its files, named by list and the cleanup, and does not stop the save.
TEST_F(RetentionTest, AStepFolderWithoutManifestHoldingOtherFilesIsLeftAndNamed) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string copied = JoinPath(root(), StepDirName(7)), dead = JoinPath(root(), StepDirName(8));
  ASSERT_TRUE(MakeDir(copied).ok());
  ASSERT_TRUE(MakeDir(dead).ok());
  for (const std::string& file : {JoinPath(copied, "rank-00000.bin"), JoinPath(copied, "notes.txt"),
                                  JoinPath(dead, "rank-00000.bin"), JoinPath(dead, "rank-123456.bin")}) {
    ASSERT_TRUE(WriteFileAtomic(file, "bytes", "test").ok()) << file;
  }
  EXPECT_EQ(FirstEntryNoSaveWrites(copied), "notes.txt");
  EXPECT_EQ(FirstEntryNoSaveWrites(dead), "");
  Result<std::vector<CheckpointInfo>> listed = ListCheckpoints(root(), false, false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_THAT((*listed)[1].problem, HasSubstr("holds notes.txt, which no save writes"));
  EXPECT_THAT((*listed)[2].problem, HasSubstr("the next save removes it"));

  std::vector<std::string> removed;
  std::vector<RemovalFailure> failed;
  ASSERT_TRUE(RemoveStaleTempDirs(root(), &removed, nullptr, &failed).ok());
  EXPECT_THAT(removed, ElementsAre(StepDirName(8)));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].name, StepDirName(7));
  EXPECT_THAT(failed[0].status.message(), HasSubstr(copied + " has no manifest but holds notes.txt"));
  EXPECT_TRUE(PathExists(JoinPath(copied, "notes.txt")));
  EXPECT_TRUE(PathExists(JoinPath(copied, "rank-00000.bin")));
  // Saving the very step it is named as says what is in the way; a later step passes it over.
  Result<SaveResult> in_the_way = SaveStep(7);
  ASSERT_FALSE(in_the_way.ok());
  EXPECT_THAT(in_the_way.status().message(), HasSubstr("holds notes.txt, which no save writes"));
  ASSERT_TRUE(SaveStep(9).ok());
  EXPECT_TRUE(PathExists(JoinPath(copied, "notes.txt")));
}

// A file (not a folder) named as a step folder, a temporary or a retired one is someone's: a save
// deleted it as "a step folder without a manifest". It is left and named, as a folder of
// someone's files is; saving that very step says what is in the way.
TEST_F(RetentionTest, AFileNamedAsAStepFolderIsLeftAndNamed) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string notes = JoinPath(root(), StepDirName(6)), temp = JoinPath(root(), TempDirName(8, RandomId()));
  for (const std::string& file : {notes, temp}) ASSERT_TRUE(WriteFileAtomic(file, "user notes", "test").ok());
  // A link so named to a file outside the root is left too (its target was never at risk; the
  // link was removed as "a step folder without a manifest").
  const std::string outside = JoinPath(dir_.path(), "elsewhere.txt"), link = JoinPath(root(), StepDirName(7));
  ASSERT_TRUE(WriteFileAtomic(outside, "kept", "test").ok());
  ASSERT_EQ(::symlink(outside.c_str(), link.c_str()), 0);
  Result<std::vector<CheckpointInfo>> listed = ListCheckpoints(root(), false, false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 4u);
  for (size_t i : {1, 2, 3}) {
    EXPECT_EQ((*listed)[i].foreign, (*listed)[i].name);
    EXPECT_THAT((*listed)[i].problem, HasSubstr("a file, not a folder a save writes"));
  }
  std::vector<std::string> removed;
  std::vector<RemovalFailure> failed;
  ASSERT_TRUE(RemoveStaleTempDirs(root(), &removed, nullptr, &failed).ok());
  EXPECT_TRUE(removed.empty());
  ASSERT_EQ(failed.size(), 3u);
  for (const RemovalFailure& f : failed) {
    EXPECT_TRUE(f.on_purpose);
    EXPECT_THAT(f.status.message(), HasSubstr(JoinPath(root(), f.name) + " is a file, not a folder a save writes"));
  }
  Result<SaveResult> in_the_way = SaveStep(6);
  ASSERT_FALSE(in_the_way.ok());
  EXPECT_THAT(in_the_way.status().message(), HasSubstr(notes + " is a file, not a folder a save writes"));
  EXPECT_THAT(in_the_way.status().message(), HasSubstr("it is in the way of step 6's folder"));
  ASSERT_TRUE(SaveStep(9).ok());
  EXPECT_EQ(ReadFileLimited(link, 100).value(), "kept");
  EXPECT_EQ(ReadFileLimited(notes, 100).value(), "user notes");
  EXPECT_EQ(ReadFileLimited(temp, 100).value(), "user notes");
}

// A folder that cannot be deleted (an immutable file, another user's file, a busy NFS file) is
// passed over and reported; retention still removes the others, and a leftover of a dead save
// that cannot go does not fail every later save (both stopped at the first such folder).
TEST_F(RetentionTest, AFolderThatCannotBeDeletedIsPassedOverAndReported) {
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(SaveStep(step).ok());
  ASSERT_TRUE(SetFailpoints("retention.remove#1=EPERM").ok());
  Result<RetentionReport> r = ApplyRetention(root(), {1, 0, "", false}, "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r->removed, ElementsAre(StepDirName(2), StepDirName(3)));
  ASSERT_EQ(r->failed.size(), 1u);
  EXPECT_EQ(r->failed[0].name, StepDirName(1));
  EXPECT_EQ(r->failed[0].status.code(), Code::kIoError);
  EXPECT_THAT(r->failed[0].status.message(), HasSubstr("remove " + StepDir(1)));
  EXPECT_THAT(Names(), ElementsAre(StepDirName(1), StepDirName(4)));

  const std::string leftover = JoinPath(root(), "step-000000009.tmp-00000000deaddead");
  ASSERT_TRUE(MakeDirs(leftover).ok());
  ASSERT_TRUE(SetFailpoints("retention.remove=EPERM").ok());
  SaveOptions keep_one;
  keep_one.keep_last = 1;
  Result<SaveResult> saved = SaveStep(5, keep_one);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_TRUE(PathExists(leftover));
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_TRUE(SaveStep(6, keep_one).ok());  // the next save removes what the last could not
  EXPECT_THAT(Names(), ElementsAre(StepDirName(6)));
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 6);

  // A leftover in the way of the step being saved is named as one, not as "already committed".
  ASSERT_TRUE(MakeDirs(StepDir(7)).ok());
  ASSERT_TRUE(SetFailpoints("retention.remove=EPERM").ok());
  Result<SaveResult> blocked = SaveStep(7);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), Code::kIoError);
  EXPECT_THAT(blocked.status().message(), HasSubstr(StepDir(7) + " is left from an earlier save of step 7 (it has no "
                                                    "manifest) and could not be removed"));
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_TRUE(SaveStep(7).ok());
}

// An operator's prune of a live root holds the root lock for a moment: the training run's save
// waits for it instead of failing (which stopped the run). Two saves still refuse each other at
// once, and a second prune is refused while one runs.
TEST_F(RetentionTest, ASaveWaitsForAPruneAndAPruneForNobody) {
  ASSERT_TRUE(SaveStep(1).ok());
  std::optional<RootLock> prune;
  {
    Result<RootLock> acquired = RootLock::AcquireForPrune(root());
    ASSERT_TRUE(acquired.ok()) << acquired.status().ToString();
    prune.emplace(std::move(acquired).value());
  }
  Result<RootLock> second = RootLock::AcquireForPrune(root());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("a save or another prune is writing into " + root()));
  SaveWhilePruneHoldsForAWhile(&prune, 2);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 2);
  // A save holding the lock: a prune is refused at once, saying so.
  Result<RootLock> save = RootLock::Acquire(root());
  ASSERT_TRUE(save.ok());
  Result<RootLock> refused = RootLock::AcquireForPrune(root());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("a save or another prune is writing into " + root()));
}

// A prune that holds the root too long (stuck, or suspended with Ctrl-Z) makes the save give up
// at half the collective deadline, saying so, before the other ranks of the save, waiting for
// rank 0 in a collective, would time out blaming it.
TEST_F(RetentionTest, ASaveGivesUpOnAPruneBeforeTheCollectiveDeadline) {
  ASSERT_TRUE(SaveStep(1).ok());
  Result<RootLock> prune = RootLock::AcquireForPrune(root());
  ASSERT_TRUE(prune.ok());
  struct Deadline {  // unset again however the test ends
    Deadline() { ::setenv("SHARDCKPT_COLLECTIVE_TIMEOUT_S", "1", 1); }
    ~Deadline() { ::unsetenv("SHARDCKPT_COLLECTIVE_TIMEOUT_S"); }
  };
  std::optional<Deadline> deadline(std::in_place);
  const auto t0 = std::chrono::steady_clock::now();
  Result<SaveResult> saved = SaveStep(2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  deadline.reset();
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(saved.status().message(), HasSubstr("a prune has held " + root() + " for "));
  EXPECT_THAT(saved.status().message(), HasSubstr("the save gives up at half the collective deadline "
                                                  "(SHARDCKPT_COLLECTIVE_TIMEOUT_S=1), before a save's other ranks, "
                                                  "waiting for this one in a collective, would blame it"));
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 5.0);
}

// On a full disk the prune lock file cannot be made (no prune ran there before): the prune locks
// the root folder itself instead, and a save still waits for it rather than fail as beside
// another save; a second prune is still refused.
TEST_F(RetentionTest, APruneWithoutRoomForItsLockFileIsStillWaitedFor) {
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SetFailpoints("lock.open#1=ENOSPC").ok());
  std::optional<RootLock> prune;
  {
    Result<RootLock> acquired = RootLock::AcquireForPrune(root());
    ASSERT_TRUE(acquired.ok()) << acquired.status().ToString();
    prune.emplace(std::move(acquired).value());
  }
  ASSERT_TRUE(SetFailpoints("lock.open#1=ENOSPC").ok());
  Result<RootLock> second = RootLock::AcquireForPrune(root());
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("a save or another prune is writing into " + root()));
  EXPECT_FALSE(PathExists(JoinPath(root(), kPruneLockName)));
  SaveWhilePruneHoldsForAWhile(&prune, 2);
  if (HasFatalFailure()) return;
}

// A prune that ends between a save's two tests (root lock taken, prune lock free) is not taken
// for another save: prunes come and go while saves take the lock, and none of them fails.
TEST_F(RetentionTest, APruneEndingAsASaveLooksIsNotAnotherSave) {
  ASSERT_TRUE(MakeDirs(root()).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> pruned{0};
  std::thread prunes([&] {
    while (!stop) {
      {
        Result<RootLock> prune = RootLock::AcquireForPrune(root());
        if (prune.ok()) {
          pruned++;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  int failed = 0, saved = 0;
  std::string first;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    Result<RootLock> save = RootLock::Acquire(root());
    if (save.ok()) saved++;
    if (!save.ok() && failed++ == 0) first = save.status().ToString();
  }
  stop = true;
  prunes.join();
  EXPECT_EQ(failed, 0) << first;
  EXPECT_GT(pruned.load(), 10);  // the prunes and the saves met (a loaded CI machine: not many)
  EXPECT_GT(saved, 10);
}

TEST_F(RetentionTest, AHeldCheckpointIsLeftForALaterSave) {
  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(1, options).ok());
  {
    Result<CheckpointHold> hold = HoldCheckpoint(root());
    ASSERT_TRUE(hold.ok());
    ASSERT_TRUE(SaveStep(2, options).ok());
    EXPECT_THAT(Names(), ElementsAre(StepDirName(1), StepDirName(2)));
    EXPECT_EQ(Or(LoadStep(hold->dir()), int64_t{-1}), 1);
  }
  ASSERT_TRUE(SaveStep(3, options).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(3)));
}

// What a dry run, and the cleanup of a dead save's folders, report for a folder a reader holds:
// left, as the real removal leaves it (a dry run said "would remove"; prune listed leftovers as
// removed before trying, and printed them as removed when another process or a reader had them).
TEST_F(RetentionTest, ADryRunAndTheCleanupReportAHeldFolderAsLeft) {
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  RetentionPolicy last_one{1, 0, "", false};
  {
    Result<CheckpointHold> hold = HoldCheckpoint(StepDir(1));
    ASSERT_TRUE(hold.ok());
    EXPECT_TRUE(HeldByReader(root(), StepDirName(1)));
    EXPECT_FALSE(HeldByReader(root(), StepDirName(2)));
    Result<RetentionReport> dry = ApplyRetention(root(), last_one, "", /*dry_run=*/true);
    ASSERT_TRUE(dry.ok()) << dry.status().ToString();
    EXPECT_THAT(dry->removed, ElementsAre());
    EXPECT_THAT(dry->deferred, ElementsAre(StepDirName(1)));
  }
  EXPECT_FALSE(HeldByReader(root(), StepDirName(1)));
  Result<RetentionReport> dry = ApplyRetention(root(), last_one, "", /*dry_run=*/true);
  ASSERT_TRUE(dry.ok());
  EXPECT_THAT(dry->removed, ElementsAre(StepDirName(1)));
  // Two leftovers of dead saves, one held: one removed, one left, each reported as such.
  const std::string held = StepDirName(3) + ".tmp-0123456789abcdef", free = StepDirName(4) + ".tmp-0123456789abcdef";
  ASSERT_TRUE(MakeDir(JoinPath(root(), held)).ok());
  ASSERT_TRUE(MakeDir(JoinPath(root(), free)).ok());
  const int fd = ::open(JoinPath(root(), held).c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  std::vector<std::string> removed, left;
  ASSERT_TRUE(RemoveStaleTempDirs(root(), &removed, &left).ok());
  ::close(fd);
  EXPECT_THAT(removed, ElementsAre(free));
  EXPECT_THAT(left, ElementsAre(held));
  EXPECT_TRUE(PathExists(JoinPath(root(), held)));
  EXPECT_FALSE(PathExists(JoinPath(root(), free)));
}

std::vector<std::string> RetiredIn(const std::string& root) {
  std::vector<std::string> out;
  for (const std::string& n : ListDir(root).value()) {
    if (IsRetiredDirName(n)) out.push_back(n);
  }
  return out;
}

// Issue 14 part 2: a save's retention makes the old checkpoint invisible before returning and
// frees its bytes on a helper thread (held back here by a sleeping failpoint, so a removal done
// before the save returned fails the test).
TEST_F(RetentionTest, RetentionFreesTheOldCheckpointAfterTheSaveReturns) {
  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(1, options).ok());
  ASSERT_TRUE(SetFailpoints("retention.background_remove=sleep:500").ok());
  ASSERT_TRUE(SaveStep(2, options).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(2)));
  std::vector<std::string> retired = RetiredIn(root());
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_THAT(retired[0], ::testing::StartsWith(".removing-" + StepDirName(1) + "-"));
  EXPECT_FALSE(PathExists(JoinPath(JoinPath(root(), retired[0]), kManifestName)));
  EXPECT_TRUE(PathExists(JoinPath(JoinPath(root(), retired[0]), RankFileName(0))));
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 2);
  // Listed as what it is: not committed, on its way out.
  Result<std::vector<CheckpointInfo>> listed = ListCheckpoints(root());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name, retired[0]);
  EXPECT_FALSE((*listed)[0].committed);
  EXPECT_EQ((*listed)[1].name, StepDirName(2));
  EXPECT_TRUE((*listed)[1].committed);
  WaitForBackgroundRemovals();
  EXPECT_THAT(RetiredIn(root()), ::testing::IsEmpty());
  // The next save waits for what is still queued, so at most one generation is in flight.
  ASSERT_TRUE(SaveStep(3, options).ok());
  ASSERT_TRUE(SaveStep(4, options).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(4)));
  EXPECT_LE(RetiredIn(root()).size(), 1u);
  WaitForBackgroundRemovals();
  EXPECT_THAT(RetiredIn(root()), ::testing::IsEmpty());
}

TEST_F(RetentionTest, ABackgroundRemovalCutShortIsFinishedByTheNextSave) {
  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(1, options).ok());
  int status = InChild([&] {
    SetFailpoints("retention.background_remove=kill").IgnoreError();
    SaveStep(2, options).status().IgnoreError();
    WaitForBackgroundRemovals();
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_THAT(Names(), ElementsAre(StepDirName(2)));
  EXPECT_EQ(RetiredIn(root()).size(), 1u);
  EXPECT_EQ(Or(LoadStep(root()), int64_t{-1}), 2);
  // `shardckpt list` shows the leftover, with the step it held and what becomes of it.
  Result<std::vector<CheckpointInfo>> listed = ListCheckpoints(root());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name, RetiredIn(root())[0]);
  EXPECT_EQ((*listed)[0].step, 1);
  EXPECT_TRUE((*listed)[0].temp);
  EXPECT_FALSE((*listed)[0].committed);
  EXPECT_THAT((*listed)[0].problem, HasSubstr("retired by retention"));
  ASSERT_TRUE(SaveStep(3).ok());
  EXPECT_THAT(RetiredIn(root()), ::testing::IsEmpty());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(2), StepDirName(3)));
}

// A linked-in checkpoint (a warm start from an archive) that a reader holds keeps its link: the
// reader reads through it, so retention leaves it for a later save as it leaves a held folder.
TEST_F(RetentionTest, AHeldLinkedCheckpointKeepsItsLinkUntilReleased) {
  const std::string archive = JoinPath(dir_.path(), "archive");
  ASSERT_TRUE(Save(*comm_, archive, 1, State(1).state).ok());
  ASSERT_TRUE(MakeDirs(root()).ok());
  ASSERT_EQ(::symlink(JoinPath(archive, StepDirName(1)).c_str(), StepDir(1).c_str()), 0);
  SaveOptions options;
  options.keep_last = 1;
  {
    Result<CheckpointHold> hold = HoldCheckpoint(StepDir(1));
    ASSERT_TRUE(hold.ok()) << hold.status().ToString();
    ASSERT_TRUE(SaveStep(2, options).ok());
    EXPECT_THAT(Names(), ElementsAre(StepDirName(1), StepDirName(2)));
    EXPECT_EQ(Or(LoadStep(hold->dir()), int64_t{-1}), 1);
  }
  ASSERT_TRUE(SaveStep(3, options).ok());
  EXPECT_THAT(Names(), ElementsAre(StepDirName(3)));
  EXPECT_EQ(Or(LoadStep(JoinPath(archive, StepDirName(1))), int64_t{-1}), 1);
}

TEST_F(RetentionTest, AFolderRemovedWhileBeingOpenedIsReportedAsRemovedNotDamaged) {
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  // Halfway through a deletion (the manifest goes first), then gone.
  ASSERT_EQ(::unlink(JoinPath(StepDir(1), kManifestName).c_str()), 0);
  Result<VerifyReport> going = VerifyCheckpoint(StepDir(1));
  ASSERT_FALSE(going.ok());
  EXPECT_EQ(going.status().code(), Code::kNotFound);
  EXPECT_THAT(going.status().message(), HasSubstr("being removed by retention or prune"));
  ASSERT_TRUE(Or(RemoveCheckpointDir(root(), StepDirName(1)), false));
  Result<VerifyReport> gone = VerifyCheckpoint(StepDir(1));
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), Code::kNotFound);
  EXPECT_THAT(gone.status().message(), Not(HasSubstr("DAMAGED")));
}

// Issue 16 part 0: saves of every step with keep_last 1 while readers loop verify and load on
// the root; every read succeeds and reads the step it resolved.
TEST_F(RetentionTest, ReadersLoopingOnTheRootNeverFailWhileRetentionRuns) {
  SaveOptions options;
  options.keep_last = 1;
  ASSERT_TRUE(SaveStep(1, options).ok());
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::vector<std::string> failures;
  std::mutex mu;
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(what);
  };
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      while (!done) {
        Result<VerifyReport> v = VerifyCheckpoint(root());
        if (!v.ok()) fail("verify: " + v.status().ToString());
        else if (!v->problems.empty()) fail("verify: DAMAGED " + v->problems[0].file + ": " + v->problems[0].what);
        ++reads;
      }
    });
    readers.emplace_back([&] {
      auto comm = CreateSingleProcessCommunicator();
      while (!done) {
        Result<int64_t> step = LoadStep(root(), comm.get());
        if (!step.ok()) fail("load: " + step.status().ToString());
        ++reads;
      }
    });
  }
  auto saver = CreateSingleProcessCommunicator();
  for (int64_t step = 2; step <= 60; ++step) {
    Result<SaveResult> saved = SaveStep(step, options, saver.get());
    if (!saved.ok()) fail("save: " + saved.status().ToString());
  }
  done = true;
  for (std::thread& t : readers) t.join();
  EXPECT_THAT(failures, ::testing::IsEmpty());
  EXPECT_GE(reads.load(), 20);
  SaveStep(61, options).status().IgnoreError();  // deletions deferred by the readers happen now
  EXPECT_THAT(Names(), ElementsAre(StepDirName(61)));
}

}  // namespace
}  // namespace shardckpt
