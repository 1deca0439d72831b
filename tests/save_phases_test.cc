// Each phase of Save on its own (engine/core/save_phases.h): the pure steps by tables, the ones
// that touch the root with a temp folder and the single-process communicator.
#include "shardckpt/engine/core/save_phases.h"

#include <cmath>
#include <functional>
#include <map>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/model/wire.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "test_util.h"

namespace shardckpt::save_phases {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ShardedState OneTensor(float* data) {
  ShardedState state;
  EXPECT_TRUE(state.AddTensor("w", DType::kFloat32, {4}, Layout::Whole(), data).ok());
  EXPECT_TRUE(state.AddBlob("rng", "seed", BlobScope::kPerRank).ok());
  return state;
}

TEST(CheckSteps, EveryRankSavesTheSameNonNegativeStep) {
  float data[4] = {};
  ShardedState state = OneTensor(data);
  struct Case {
    int64_t step;
    std::vector<int64_t> theirs;  // by rank; -100: a truncated description
    Code code;
    std::string message;
  } cases[] = {
      {2, {2, 2}, Code::kOk, ""},
      {-1, {-1}, Code::kInvalidArgument, "step -1 is negative; steps start at 0"},
      {2, {2, 3}, Code::kInvalidArgument, "rank 1 saves step 3 but rank 0 saves step 2"},
      {2, {2, -100}, Code::kInternal, "truncated description from rank 1"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> gathered;
    for (int64_t s : c.theirs) gathered.push_back(s == -100 ? "" : DescribeRank(s, "h", state));
    Status status = CheckSteps(c.step, gathered);
    EXPECT_EQ(status.code(), c.code) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

TEST(DecodeDescriptions, RanksAndDistinctHosts) {
  float data[4] = {};
  ShardedState state = OneTensor(data);
  Result<Descriptions> d =
      DecodeDescriptions({DescribeRank(1, "h0", state), DescribeRank(1, "h1", state), DescribeRank(1, "h0", state)});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->ranks.size(), 3u);
  EXPECT_EQ(d->ranks[2].pieces.at(0).name, "w");
  EXPECT_EQ(d->ranks[2].pieces.at(0).bytes, 16);
  EXPECT_EQ(d->ranks[2].blobs.at(0).name, "rng");
  EXPECT_THAT(d->hosts, ElementsAre("h0", "h1"));

  WireWriter bad;
  bad.U64(1);
  bad.Str("h");
  bad.Str("not a description");
  Result<Descriptions> broken = DecodeDescriptions({DescribeRank(1, "h0", state), bad.bytes()});
  EXPECT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("rank 1: "));
  EXPECT_EQ(DecodeDescriptions({"x"}).status().message(), "truncated description from rank 0");
}

TEST(WriteReport, RoundTripsAndRefusesTruncation) {
  WriteReport cases[3];
  cases[1].status = Status(Code::kNoSpace, "disk full");
  cases[2].wrote_file = true;
  cases[2].file = FileRecord{"rank-00001.bin", 12288, 8192, {7, 9}};
  cases[2].piece_offsets = {{0, 0}, {2, 4096}};
  cases[2].blob_offsets = {{1, 8000}};
  for (const WriteReport& r : cases) {
    const std::string bytes = EncodeWriteReport(r);
    Result<WriteReport> back = DecodeWriteReport(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->status.code(), r.status.code());
    EXPECT_EQ(back->status.message(), r.status.message());
    EXPECT_EQ(back->wrote_file, r.wrote_file);
    EXPECT_EQ(back->file.name, r.file.name);
    EXPECT_EQ(back->file.size, r.file.size);
    EXPECT_EQ(back->file.table_offset, r.file.table_offset);
    EXPECT_EQ(back->file.table_page_sums, r.file.table_page_sums);
    EXPECT_EQ(back->piece_offsets, r.piece_offsets);
    EXPECT_EQ(back->blob_offsets, r.blob_offsets);
    EXPECT_EQ(DecodeWriteReport(bytes.substr(0, bytes.size() - 1)).status().message(), "truncated write report");
    EXPECT_EQ(DecodeWriteReport(bytes + "x").status().message(), "truncated write report");
  }
}

class PlanMessage : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
};

TEST_F(PlanMessage, RoundTripsAndNamesItsFailures) {
  SavePlan plan;
  plan.writes_piece = {{true, false}, {false, true}};
  plan.writes_blob = {{true}, {false}};
  plan.bytes_per_rank = {16, 32};
  const std::string bytes = EncodePlanMessage("step-1.tmp-x", 77, &plan);
  std::string temp_name;
  int64_t plan_id = 0;
  std::shared_ptr<const SavePlan> back;
  ASSERT_TRUE(DecodePlanMessage(bytes, 2, &temp_name, &plan_id, &back).ok());
  EXPECT_EQ(temp_name, "step-1.tmp-x");
  EXPECT_EQ(plan_id, 77);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->writes_piece, plan.writes_piece);
  EXPECT_EQ(back->writes_blob, plan.writes_blob);

  // A reused plan travels as its id only.
  const std::string reused = EncodePlanMessage("step-2.tmp-y", 77, nullptr);
  EXPECT_LT(reused.size(), bytes.size());
  ASSERT_TRUE(DecodePlanMessage(reused, 2, &temp_name, &plan_id, &back).ok());
  EXPECT_EQ(temp_name, "step-2.tmp-y");
  EXPECT_EQ(plan_id, 77);
  EXPECT_EQ(back, nullptr);

  EXPECT_EQ(DecodePlanMessage(bytes.substr(0, 10), 2, &temp_name, &plan_id, &back).message(),
            "truncated save plan from rank 0");
  EXPECT_FALSE(DecodePlanMessage(bytes, 3, &temp_name, &plan_id, &back).ok());  // planned for another world
  ASSERT_TRUE(SetFailpoints("save.decode_plan=EIO").ok());
  Status failed = DecodePlanMessage(bytes, 2, &temp_name, &plan_id, &back);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.ToString(), HasSubstr("save plan from rank 0"));
}

TEST(CollectReports, OneErrorNamingEveryFailingRank) {
  WriteReport ok, full, broken;
  full.status = Status(Code::kNoSpace, "disk full");
  broken.status = Status(Code::kIoError, "EIO");
  struct Case {
    std::vector<std::string> reports;
    Code code;
    std::string message;
  } cases[] = {
      {{EncodeWriteReport(ok), EncodeWriteReport(ok)}, Code::kOk, ""},
      {{EncodeWriteReport(ok), EncodeWriteReport(full), EncodeWriteReport(broken)}, Code::kNoSpace,
       "save of step 5 failed: rank 1: disk full; rank 2: IoError: EIO"},
      {{EncodeWriteReport(full), EncodeWriteReport(ok), EncodeWriteReport(full)}, Code::kNoSpace,
       "save of step 5 failed: ranks 0, 2: disk full"},
      {{EncodeWriteReport(ok), "junk", EncodeWriteReport(full)}, Code::kInternal, "rank 1: truncated write report"},
  };
  for (const Case& c : cases) {
    Result<std::vector<WriteReport>> reports = CollectReports(5, c.reports);
    EXPECT_EQ(reports.status().code(), c.code) << c.message;
    EXPECT_EQ(reports.status().message(), c.message);
    if (reports.ok()) {
      EXPECT_EQ(reports->size(), c.reports.size());
    }
  }
}

// Pieces are matched to entries by name whatever their index on each rank: a rank holding two
// pieces of one tensor, a rank that wrote no file between two that did, names at other indices.
// Chunks stay in rank order, files numbered by the ranks that wrote.
TEST(BuildManifest, PiecesFindTheirEntryWhateverTheirIndexOnEachRank) {
  Descriptions described;
  described.ranks.resize(4);
  described.ranks[0].pieces = {{"w", DType::kFloat32, {8}, Layout::Box({0}, {2}), 8},
                               {"w", DType::kFloat32, {8}, Layout::Box({2}, {2}), 8}};
  described.ranks[1].pieces = {{"w", DType::kFloat32, {8}, Layout::Box({0}, {0}), 0}};
  described.ranks[2].pieces = {{"c", DType::kInt32, {2}, Layout::Box({0}, {2}), 8},
                               {"w", DType::kFloat32, {8}, Layout::Box({4}, {2}), 8}};
  described.ranks[3].pieces = {{"w", DType::kFloat32, {8}, Layout::Box({6}, {2}), 8}};
  std::vector<WriteReport> reports(4);
  for (int r : {0, 2, 3}) {
    reports[r].wrote_file = true;
    reports[r].file = FileRecord{RankFileName(r), 8192, 4096, {1}};
  }
  reports[0].piece_offsets = {{1, 16}, {0, 0}};  // reported out of index order
  reports[2].piece_offsets = {{0, 0}, {1, 8}};
  reports[3].piece_offsets = {{0, 0}};
  int64_t total = 0;
  Manifest m = BuildManifest(1, described, reports, SaveOptions{}, &total);
  ASSERT_EQ(m.files.size(), 3u);
  EXPECT_EQ(m.files[1].name, RankFileName(2));
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].name, "c");
  EXPECT_EQ(m.entries[0].dtype, DType::kInt32);
  ASSERT_EQ(m.entries[0].chunks.size(), 1u);
  EXPECT_EQ(m.entries[0].chunks[0].file, 1u);
  const EntryRecord& w = m.entries[1];
  EXPECT_EQ(w.name, "w");
  std::vector<std::tuple<uint32_t, uint64_t, Layout>> chunks;
  for (const ChunkRecord& c : w.chunks) chunks.emplace_back(c.file, c.offset, c.layout);
  EXPECT_EQ(chunks, (std::vector<std::tuple<uint32_t, uint64_t, Layout>>{{0, 16, Layout::Box({2}, {2})},
                                                                         {0, 0, Layout::Box({0}, {2})},
                                                                         {1, 8, Layout::Box({4}, {2})},
                                                                         {2, 0, Layout::Box({6}, {2})}}));
  EXPECT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m).ToString();
}

TEST(BuildManifest, EntriesByNameChunksOfNonEmptyPiecesAndBlobs) {
  Descriptions described;
  described.hosts = {"h0", "h1"};
  described.ranks.resize(3);
  described.ranks[0].pieces = {{"z", DType::kFloat32, {4}, Layout::Box({0}, {2}), 8},
                               {"a", DType::kInt64, {1}, Layout::Whole(), 8}};
  described.ranks[0].blobs = {{"step", BlobScope::kGlobal, 4}};
  described.ranks[1].pieces = {{"z", DType::kFloat32, {4}, Layout::Box({2}, {2}), 8},
                               {"e", DType::kFloat32, {0}, Layout::Whole(), 0}};
  std::vector<WriteReport> reports(3);
  reports[0].wrote_file = true;
  reports[0].file = FileRecord{"rank-00000.bin", 8192, 4096, {1}};
  reports[0].piece_offsets = {{0, 0}, {1, 8}};
  reports[0].blob_offsets = {{0, 16}};
  reports[1].wrote_file = true;
  reports[1].file = FileRecord{"rank-00001.bin", 4096 + 4096, 4096, {2}};
  reports[1].piece_offsets = {{0, 0}, {1, 8}};
  // rank 2 wrote nothing
  SaveOptions options;
  options.metrics = {{"loss", 0.5}};
  int64_t total = 0;
  Manifest m = BuildManifest(7, described, reports, options, &total);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.world_size, 3);
  EXPECT_EQ(total, 16384);
  EXPECT_EQ(m.metrics, options.metrics);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[1].name, "rank-00001.bin");
  ASSERT_EQ(m.entries.size(), 3u);
  EXPECT_EQ(m.entries[0].name, "a");
  EXPECT_EQ(m.entries[1].name, "e");
  EXPECT_TRUE(m.entries[1].chunks.empty());  // an empty piece needs no chunk
  EXPECT_EQ(m.entries[2].name, "z");
  ASSERT_EQ(m.entries[2].chunks.size(), 2u);
  EXPECT_EQ(m.entries[2].chunks[1].file, 1u);
  EXPECT_EQ(m.entries[2].chunks[1].layout, Layout::Box({2}, {2}));
  ASSERT_EQ(m.blobs.size(), 1u);
  EXPECT_EQ(m.blobs[0].name, "step");
  EXPECT_EQ(m.blobs[0].offset, 16u);
  EXPECT_EQ(m.blobs[0].bytes, 4u);
}

class SavePhasesOnDisk : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }
  std::vector<std::string> Gathered(int64_t step) { return {DescribeRank(step, "h", state_)}; }

  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
  float data_[4] = {1, 2, 3, 4};
  ShardedState state_ = OneTensor(data_);
};

TEST_F(SavePhasesOnDisk, PlanOnRootLocksPlansAndCreatesTheTempFolder) {
  PlannedSave elsewhere = PlanOnRoot(1, root(), 2, Gathered(2), SaveOptions{});
  EXPECT_TRUE(elsewhere.status.ok());
  EXPECT_EQ(elsewhere.lock, nullptr);
  EXPECT_FALSE(PathExists(root()));

  PlannedSave planned = PlanOnRoot(0, root(), 2, Gathered(2), SaveOptions{});
  ASSERT_TRUE(planned.status.ok()) << planned.status.ToString();
  EXPECT_NE(planned.lock, nullptr);
  EXPECT_TRUE(IsTempDirName(planned.temp_name));
  EXPECT_TRUE(PathExists(JoinPath(root(), planned.temp_name)));
  ASSERT_NE(planned.plan, nullptr);
  EXPECT_EQ(planned.plan->writes_piece, (std::vector<std::vector<bool>>{{true}}));
  EXPECT_GT(planned.plan_id, 0);
  EXPECT_FALSE(planned.reused);
  EXPECT_FALSE(planned.plan_bytes.empty());

  // The root is locked while `planned` lives.
  PlannedSave second = PlanOnRoot(0, root(), 3, Gathered(3), SaveOptions{});
  EXPECT_EQ(second.status.code(), Code::kFailedPrecondition);
  EXPECT_THAT(second.status.message(), HasSubstr("save of step 3 failed on rank 0: "));
}

TEST_F(SavePhasesOnDisk, PlanOnRootRefusesBadInputBeforeTouchingTheRoot) {
  SaveOptions bad_metric;
  bad_metric.metrics = {{"loss", std::nan("")}};
  SaveOptions bad_policy;
  bad_policy.keep_best = 1;  // without a metric
  struct Case {
    int64_t step;
    SaveOptions options;
  } cases[] = {{-1, SaveOptions{}}, {1, bad_metric}, {1, bad_policy}};
  for (const Case& c : cases) {
    PlannedSave planned = PlanOnRoot(0, root(), c.step, Gathered(c.step), c.options);
    EXPECT_EQ(planned.status.code(), Code::kInvalidArgument) << planned.status.ToString();
    EXPECT_THAT(planned.status.message(), HasSubstr("save of step " + std::to_string(c.step) + " failed on rank 0: "));
    EXPECT_FALSE(PathExists(root()));
  }
}

TEST_F(SavePhasesOnDisk, EveryPhaseInOrderCommitsTheStep) {
  PlannedSave planned = PlanOnRoot(0, root(), 4, Gathered(4), SaveOptions{});
  ASSERT_TRUE(SharePlan(*comm_, &planned).ok());
  ASSERT_TRUE(planned.decoded.ok());
  const std::string temp_dir = JoinPath(root(), planned.temp_name);
  WriteReport report = WriteRankFile(0, temp_dir, state_, planned, SaveOptions{});
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_TRUE(report.wrote_file);
  EXPECT_EQ(report.piece_offsets.size(), 1u);
  EXPECT_EQ(report.blob_offsets.size(), 1u);
  int64_t total = 0;
  ASSERT_TRUE(CommitOnRoot(root(), 4, planned, {EncodeWriteReport(report)}, SaveOptions{}, &total).ok());
  EXPECT_EQ(total, static_cast<int64_t>(report.file.size));
  EXPECT_TRUE(PathExists(JoinPath(JoinPath(root(), StepDirName(4)), kManifestName)));
  EXPECT_FALSE(PathExists(temp_dir));
  int64_t shared = total;
  EXPECT_TRUE(ShareOutcome(*comm_, Status::Ok(), &shared).ok());
  EXPECT_EQ(shared, total);
  EXPECT_EQ(ShareOutcome(*comm_, Internal("x"), &shared).code(), Code::kInternal);
}

TEST_F(SavePhasesOnDisk, AFailedWriteIsReportedAndTheTempFolderRemoved) {
  PlannedSave planned = PlanOnRoot(0, root(), 4, Gathered(4), SaveOptions{});
  ASSERT_TRUE(planned.status.ok());
  const std::string temp_dir = JoinPath(root(), planned.temp_name);
  ASSERT_TRUE(SetFailpoints("save.write_data=EIO").ok());
  WriteReport report = WriteRankFile(0, temp_dir, state_, planned, SaveOptions{});
  ASSERT_TRUE(SetFailpoints("").ok());
  EXPECT_FALSE(report.status.ok());
  EXPECT_THAT(report.status.message(), HasSubstr("writing " + JoinPath(temp_dir, RankFileName(0)) + ": "));
  int64_t total = 0;
  Status committed = CommitOnRoot(root(), 4, planned, {EncodeWriteReport(report)}, SaveOptions{}, &total);
  EXPECT_EQ(committed.code(), report.status.code());
  EXPECT_THAT(committed.message(), HasSubstr("save of step 4 failed: rank 0: "));
  EXPECT_FALSE(PathExists(temp_dir));
  EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(4))));

  // A plan this rank could not decode is its report, unchanged.
  planned.decoded = Internal("truncated save plan from rank 0");
  WriteReport undecoded = WriteRankFile(1, temp_dir, state_, planned, SaveOptions{});
  EXPECT_EQ(undecoded.status.message(), "truncated save plan from rank 0");
  EXPECT_FALSE(undecoded.wrote_file);
}

// The digest covers what the plan and manifest are made from, and nothing else.
TEST(DescriptionDigest, ChangesWithEveryDescribedFieldAndNotWithTheBytes) {
  float a[8] = {}, b[8] = {1, 2, 3};
  auto make = [&](auto change) {
    ShardedState s;
    EXPECT_TRUE(s.AddTensor("w", DType::kFloat32, {8}, Layout::Box({0}, {8}), a).ok());
    EXPECT_TRUE(s.AddBlob("rng", "seed", BlobScope::kPerRank).ok());
    change(s);
    return DescriptionDigest("h", s);
  };
  const uint64_t base = make([](ShardedState&) {});
  EXPECT_EQ(base, make([](ShardedState&) {}));
  ShardedState other_data;
  ASSERT_TRUE(other_data.AddTensor("w", DType::kFloat32, {8}, Layout::Box({0}, {8}), b).ok());
  ASSERT_TRUE(other_data.AddBlob("rng", "SEED", BlobScope::kPerRank).ok());  // same size, other bytes
  EXPECT_EQ(DescriptionDigest("h", other_data), base);
  EXPECT_NE(DescriptionDigest("other-host", other_data), base);
  EXPECT_NE(DescriptionDigest("h", other_data, /*pack_small_chunks=*/false), base);
  // Every field a change of which must plan afresh.
  std::vector<uint64_t> changed = {
      make([&](ShardedState& s) { s.AddTensor("x", DType::kFloat32, {8}, Layout::Whole(), a).IgnoreError(); }),
      make([&](ShardedState& s) { s.AddBlob("extra", "1").IgnoreError(); }),
      make([&](ShardedState& s) { s.AddBlob("more", "1", BlobScope::kPerRank).IgnoreError(); }),
  };
  for (auto [dtype, shape, layout] :
       {std::tuple{DType::kInt32, Shape{8}, Layout::Box({0}, {8})}, std::tuple{DType::kFloat32, Shape{2, 4}, Layout::Box({0, 0}, {2, 4})},
        std::tuple{DType::kFloat32, Shape{8}, Layout::FlatRange(0, 8)}, std::tuple{DType::kFloat32, Shape{8}, Layout::Whole()},
        std::tuple{DType::kFloat32, Shape{16}, Layout::Box({0}, {8})}}) {
    ShardedState s;
    ASSERT_TRUE(s.AddTensor("w", dtype, shape, layout, a).ok());
    ASSERT_TRUE(s.AddBlob("rng", "seed", BlobScope::kPerRank).ok());
    changed.push_back(DescriptionDigest("h", s));
  }
  ShardedState renamed;
  ASSERT_TRUE(renamed.AddTensor("v", DType::kFloat32, {8}, Layout::Box({0}, {8}), a).ok());
  ASSERT_TRUE(renamed.AddBlob("rng", "seed", BlobScope::kPerRank).ok());
  changed.push_back(DescriptionDigest("h", renamed));
  ShardedState longer_blob;
  ASSERT_TRUE(longer_blob.AddTensor("w", DType::kFloat32, {8}, Layout::Box({0}, {8}), a).ok());
  ASSERT_TRUE(longer_blob.AddBlob("rng", "seed2", BlobScope::kPerRank).ok());
  changed.push_back(DescriptionDigest("h", longer_blob));
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_NE(changed[i], base) << "change " << i;
    for (size_t j = i + 1; j < changed.size(); ++j) EXPECT_NE(changed[i], changed[j]) << i << " vs " << j;
  }
  // Pieces count in order; a cleared state starts afresh.
  auto two = [&](const char* first, const char* second) {
    ShardedState s;
    EXPECT_TRUE(s.AddTensor(first, DType::kFloat32, {8}, Layout::Whole(), a).ok());
    EXPECT_TRUE(s.AddTensor(second, DType::kFloat32, {8}, Layout::Whole(), a).ok());
    return s;
  };
  EXPECT_NE(DescriptionDigest("h", two("p", "q")), DescriptionDigest("h", two("q", "p")));
  ShardedState refilled = two("q", "p");
  refilled.Clear();
  ASSERT_TRUE(refilled.AddTensor("p", DType::kFloat32, {8}, Layout::Whole(), a).ok());
  ASSERT_TRUE(refilled.AddTensor("q", DType::kFloat32, {8}, Layout::Whole(), a).ok());
  EXPECT_EQ(DescriptionDigest("h", refilled), DescriptionDigest("h", two("p", "q")));
  // A piece of more fields than one fold holds: its last ones count too.
  auto twelve_dims = [&](int64_t last_size) {
    ShardedState s;
    Shape shape(12, 1);
    shape.back() = 8;
    Dims offsets(std::vector<int64_t>(12, 0)), sizes(std::vector<int64_t>(12, 1));
    sizes[11] = last_size;
    EXPECT_TRUE(s.AddTensor("t", DType::kFloat32, shape, Layout::Box(offsets, sizes), a).ok());
    return DescriptionDigest("h", s);
  };
  EXPECT_EQ(twelve_dims(4), twelve_dims(4));
  EXPECT_NE(twelve_dims(4), twelve_dims(8));
  // The digest hashes exactly the description's encoding.
  ShardedState s;
  ASSERT_TRUE(s.AddTensor("w", DType::kFloat32, {8}, Layout::Box({0}, {8}), a).ok());
  EXPECT_EQ(EncodeStateDescription(s), EncodeRankDescription(DescribeState(s)));
}

// Save with a SavePlanCache on one rank: a repeat of the same layout reuses the plan, any change
// plans afresh, and each checkpoint's manifest describes what was saved then.
TEST_F(SavePhasesOnDisk, APlanCacheIsReusedUntilTheLayoutChanges) {
  SavePlanCache cache;
  SaveOptions options;
  options.plan_cache = &cache;
  ASSERT_TRUE(Save(*comm_, root(), 1, state_, options).ok());
  EXPECT_EQ(cache.plans_made, 1u);
  EXPECT_EQ(cache.plans_reused, 0u);
  const int64_t first_id = cache.plan_id;
  data_[0] = 9;  // new values, same layout
  ASSERT_TRUE(Save(*comm_, root(), 2, state_, options).ok());
  ASSERT_TRUE(Save(*comm_, root(), 3, state_, options).ok());
  EXPECT_EQ(cache.plans_made, 1u);
  EXPECT_EQ(cache.plans_reused, 2u);
  EXPECT_EQ(cache.plan_id, first_id);
  Result<Manifest> third = ReadManifest(JoinPath(root(), StepDirName(3)));
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_EQ(third->entries.size(), 1u);
  EXPECT_EQ(third->entries[0].name, "w");

  // A new entry: planned afresh, and the manifest holds it.
  float more[2] = {5, 6};
  ASSERT_TRUE(state_.AddTensor("b", DType::kFloat32, {2}, Layout::Whole(), more).ok());
  ASSERT_TRUE(Save(*comm_, root(), 4, state_, options).ok());
  EXPECT_EQ(cache.plans_made, 2u);
  EXPECT_EQ(cache.plans_reused, 2u);
  EXPECT_NE(cache.plan_id, first_id);
  Result<Manifest> fourth = ReadManifest(JoinPath(root(), StepDirName(4)));
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->entries.size(), 2u);

  // Without the cache every save plans; the vote still runs and finds nothing to reuse.
  ASSERT_TRUE(Save(*comm_, root(), 5, state_, SaveOptions{}).ok());
  EXPECT_EQ(cache.plans_made, 2u);
  // A failed save keeps the plan: the next save of the same layout still reuses it.
  ASSERT_FALSE(Save(*comm_, root(), -1, state_, options).ok());
  ASSERT_TRUE(Save(*comm_, root(), 6, state_, options).ok());
  EXPECT_EQ(cache.plans_made, 2u);
  EXPECT_EQ(cache.plans_reused, 3u);
}

// A repeat save of a kept plan reuses the kept manifest's entries and blobs, validated and
// encoded, with this save's own step, creation, metrics and checksum tables: the manifest is
// what a save without the cache writes, and the data it describes reads back.
TEST_F(SavePhasesOnDisk, ARepeatSaveReusesTheKeptManifestWithItsOwnStepMetricsAndChecksums) {
  SavePlanCache cache;
  SaveOptions options;
  options.plan_cache = &cache;
  ASSERT_TRUE(Save(*comm_, root(), 1, state_, options).ok());
  ASSERT_NE(cache.manifest, nullptr);
  const KeptManifest* kept = cache.manifest.get();
  EXPECT_EQ(kept->plan_id, cache.plan_id);

  data_[0] = 9;  // new values: new checksums, same places
  options.metrics = {{"loss", 0.25}};
  options.user_metadata = {{"run", "a"}};
  Result<SaveResult> second = Save(*comm_, root(), 2, state_, options);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(cache.manifest.get(), kept);  // reused, not rebuilt
  SaveOptions uncached = options;
  uncached.plan_cache = nullptr;
  ASSERT_TRUE(Save(*comm_, root(), 3, state_, uncached).ok());

  Result<Manifest> reused = ReadManifest(JoinPath(root(), StepDirName(2)));
  Result<Manifest> built = ReadManifest(JoinPath(root(), StepDirName(3)));
  ASSERT_TRUE(reused.ok()) << reused.status().ToString();
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(reused->step, 2);
  EXPECT_EQ(reused->metrics, options.metrics);
  EXPECT_EQ(reused->created.user, options.user_metadata);
  Manifest expected = *built;  // the same but for its step and creation time
  expected.step = 2;
  expected.created.time = reused->created.time;
  EXPECT_EQ(EncodeManifest(*reused).value(), EncodeManifest(expected).value());
  Result<Manifest> first = ReadManifest(JoinPath(root(), StepDirName(1)));
  ASSERT_TRUE(first.ok());
  EXPECT_NE(first->files[0].table_page_sums, reused->files[0].table_page_sums);

  float loaded[4] = {};
  ShardedState into = OneTensor(loaded);
  Result<LoadReport> report = Load(*comm_, JoinPath(root(), StepDirName(2)), into);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(loaded[0], 9);
  EXPECT_EQ(loaded[3], 4);

  // A plan made afresh drops the manifest kept for the old one, even when its save then fails
  // before the commit; the next good save keeps its own.
  float more[2] = {5, 6};
  ASSERT_TRUE(state_.AddTensor("b", DType::kFloat32, {2}, Layout::Whole(), more).ok());
  ASSERT_TRUE(SetFailpoints("save.write_data=EIO").ok());
  EXPECT_FALSE(Save(*comm_, root(), 4, state_, options).ok());
  ASSERT_TRUE(SetFailpoints("").ok());
  EXPECT_EQ(cache.manifest, nullptr);
  ASSERT_TRUE(Save(*comm_, root(), 5, state_, options).ok());
  ASSERT_NE(cache.manifest, nullptr);
  EXPECT_EQ(cache.manifest->plan_id, cache.plan_id);
  EXPECT_THAT(cache.manifest->body.text, HasSubstr("{\"name\": \"b\""));
  EXPECT_TRUE(cache.manifest->head.entries.empty());  // kept as text only
}

// A repeat save writes the kept entries and blobs into the temp folder's manifest while the data
// files are written, and the commit completes that file (manifest_ahead.h); when the early write
// fails, or the head outgrew its room, the commit writes the manifest whole. Every one of those
// checkpoints reads back with its own values. 300 tensors: a body of many blocks.
TEST_F(SavePhasesOnDisk, ARepeatSaveWritesTheKeptBodyEarlyAndFallsBackToAWholeWrite) {
  constexpr int kTensors = 300;
  std::vector<float> values(kTensors * 2, 1.0f);
  auto state_of = [](std::vector<float>& data) {
    ShardedState state;
    for (int i = 0; i < kTensors; ++i) {
      EXPECT_TRUE(state.AddTensor("layers." + std::to_string(i) + ".bias", DType::kFloat32, {2}, Layout::Whole(),
                                  data.data() + 2 * i)
                      .ok());
    }
    return state;
  };
  ShardedState state = state_of(values);
  auto reads_back = [&](int64_t step, float first) {
    std::vector<float> loaded(kTensors * 2, 0.0f);
    ShardedState into = state_of(loaded);
    Result<LoadReport> report = Load(*comm_, JoinPath(root(), StepDirName(step)), into);
    EXPECT_TRUE(report.ok()) << "step " << step << ": " << report.status().ToString();
    EXPECT_EQ(loaded[0], first) << "step " << step;
    EXPECT_EQ(loaded[kTensors * 2 - 1], 1.0f) << "step " << step;
  };
  auto no_temp_folder = [&] {
    for (const std::string& name : ListDir(root()).value()) EXPECT_FALSE(IsTempDirName(name)) << name;
  };
  SavePlanCache cache;
  SaveOptions options;
  options.plan_cache = &cache;
  ASSERT_TRUE(Save(*comm_, root(), 1, state, options).ok());
  EXPECT_EQ(cache.manifests_written_early, 0u);  // nothing kept yet
  ASSERT_NE(cache.manifest, nullptr);
  const uint64_t room = cache.manifest->head_room;
  EXPECT_EQ(room % 4096, 0u);
  EXPECT_GT(cache.manifest->body.text.size(), 3 * 4096u);

  values[0] = 7;
  ASSERT_TRUE(Save(*comm_, root(), 2, state, options).ok());
  EXPECT_EQ(cache.manifests_written_early, 1u);
  Result<std::string> text = ReadFileLimited(JoinPath(JoinPath(root(), StepDirName(2)), kManifestName), 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->size() % 4096, 0u);
  EXPECT_EQ(text->compare(room, cache.manifest->body.text.size(), cache.manifest->body.text), 0);
  reads_back(2, 7);

  // The early write fails: the commit writes the manifest whole, and the save stands.
  values[0] = 8;
  ASSERT_TRUE(SetFailpoints("commit.manifest_ahead=EIO").ok());
  Result<SaveResult> whole = Save(*comm_, root(), 3, state, options);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(cache.manifests_written_early, 1u);
  reads_back(3, 8);
  ASSERT_TRUE(SetFailpoints("").ok());

  // A head that outgrew its room: written whole, and the next save has room for it.
  for (int i = 0; i < 200; ++i) options.metrics["a rather long metric name, number " + std::to_string(i)] = i;
  values[0] = 9;
  ASSERT_TRUE(Save(*comm_, root(), 4, state, options).ok());
  EXPECT_EQ(cache.manifests_written_early, 1u);
  reads_back(4, 9);
  EXPECT_GT(cache.manifest->head_room, room);
  EXPECT_EQ(ReadManifest(JoinPath(root(), StepDirName(4))).value().metrics.size(), 200u);
  values[0] = 10;
  ASSERT_TRUE(Save(*comm_, root(), 5, state, options).ok());
  EXPECT_EQ(cache.manifests_written_early, 2u);
  reads_back(5, 10);

  // The completed file's own write or sync fails: the save fails, its folder is gone, and the
  // next save commits.
  for (const char* failpoint : {"commit.manifest.write=EIO", "commit.manifest.fsync=EIO"}) {
    ASSERT_TRUE(SetFailpoints(failpoint).ok());
    Result<SaveResult> failed = Save(*comm_, root(), 6, state, options);
    EXPECT_EQ(failed.status().code(), Code::kIoError) << failpoint;
    EXPECT_THAT(failed.status().message(), HasSubstr(kManifestName)) << failpoint;
    no_temp_folder();
    EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(6))));
  }
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_TRUE(Save(*comm_, root(), 6, state, options).ok());
  EXPECT_EQ(cache.manifests_written_early, 3u);
  reads_back(6, 10);

  // A save that fails in its data phase leaves no temp folder behind, the early manifest
  // included (the commit waits for it and closes it before removing the folder).
  ASSERT_TRUE(SetFailpoints("save.write_data=EIO").ok());
  EXPECT_FALSE(Save(*comm_, root(), 7, state, options).ok());
  no_temp_folder();
}

TEST(PlacedAlike, EveryPlacementAndFileFieldCountsButNotTheChecksumValues) {
  WriteReport base;
  base.wrote_file = true;
  base.file.name = "rank-00000.bin";
  base.file.size = 8192;
  base.file.table_offset = 4096;
  base.file.table_page_sums = {1};
  base.piece_offsets = {{0, 0}, {1, 64}};
  base.blob_offsets = {{0, 128}};
  const std::vector<WriteReport> before = {base, base};
  EXPECT_TRUE(PlacedAlike(before, before));
  std::vector<WriteReport> other_sums = before;
  other_sums[1].file.table_page_sums = {2};
  EXPECT_TRUE(PlacedAlike(other_sums, before));

  std::vector<std::function<void(WriteReport&)>> changes = {
      [](WriteReport& r) { r.wrote_file = false; },
      [](WriteReport& r) { r.file.name = "rank-00002.bin"; },
      [](WriteReport& r) { r.file.size = 12288; },
      [](WriteReport& r) { r.file.table_offset = 8192; },
      [](WriteReport& r) { r.file.checksums = false; },
      [](WriteReport& r) { r.file.table_page_sums = {1, 1}; },
      [](WriteReport& r) { r.piece_offsets[1].second = 72; },
      [](WriteReport& r) { r.piece_offsets.pop_back(); },
      [](WriteReport& r) { r.blob_offsets[0].second = 136; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    std::vector<WriteReport> now = before;
    changes[i](now[1]);
    EXPECT_FALSE(PlacedAlike(now, before)) << "change " << i;
  }
  EXPECT_FALSE(PlacedAlike({base}, before));  // another world
}

// Every rank's global values, as EncodeGlobalValues gives them, judged together: a value held
// with different bytes is named with who holds what; a value only some ranks hold is no conflict.
TEST(GlobalValues, ConflictsAreNamedAndMissingValuesAreNot) {
  auto state_with = [](std::vector<std::pair<std::string, std::string>> values) {
    auto s = std::make_unique<ShardedState>();
    for (auto& [name, bytes] : values) EXPECT_TRUE(s->AddBlob(name, bytes).ok());
    EXPECT_TRUE(s->AddBlob("mine", "per rank " + std::to_string(values.size()), BlobScope::kPerRank).ok());
    return s;
  };
  struct Case {
    std::vector<std::vector<std::pair<std::string, std::string>>> ranks;
    std::string error;  // "" for none
  } cases[] = {
      {{{{"step", "7"}, {"cfg", "x"}}, {{"cfg", "x"}, {"step", "7"}}}, ""},  // order does not matter
      {{{{"step", "7"}}, {}, {{"step", "7"}}}, ""},                          // rank 1 lacks it
      {{{{"step", "7"}, {"rng", "a"}}, {{"step", "7"}, {"rng", "a"}}, {{"step", "7"}, {"rng", "b"}}},
       "the global value 'rng' differs between ranks (ranks 0-1 and rank 2 hold different bytes), but a global "
       "value is saved once, from rank 0"},
      {{{{"rng", "b"}}, {{"rng", "a"}}, {{"rng", "c"}}, {{"rng", "a"}}},
       "the global value 'rng' differs between ranks (rank 0, ranks 1, 3 and rank 2 hold different bytes)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> gathered;
    uint64_t first = 0;
    bool digests_differ = false;
    for (size_t r = 0; r < c.ranks.size(); ++r) {
      auto state = state_with(c.ranks[r]);
      gathered.push_back(EncodeGlobalValues(*state));
      if (r == 0) first = GlobalValuesDigest(*state);
      digests_differ |= GlobalValuesDigest(*state) != first;
    }
    Status conflicts = GlobalValueConflicts(gathered);
    if (c.error.empty()) {
      EXPECT_TRUE(conflicts.ok()) << conflicts.ToString();
    } else {
      EXPECT_TRUE(digests_differ) << "the vote must see it";
      EXPECT_EQ(conflicts.code(), Code::kInvalidArgument);
      EXPECT_THAT(conflicts.message(), HasSubstr(c.error));
    }
  }
}

// What rank 0 records and applies for everyone: ranks must pass the same. A table of each
// rank's options and the refusal expected ("" when they agree).
TEST(SaveOptionsAgreement, DifferencesAreNamedAndReductionNoiseIsNot) {
  auto with = [](int keep_last, std::map<std::string, double> metrics, std::map<std::string, std::string> user = {}) {
    SaveOptions o;
    o.keep_last = keep_last;
    o.metrics = std::move(metrics);
    o.user_metadata = std::move(user);
    return o;
  };
  struct Case {
    const char* what;
    std::vector<SaveOptions> ranks;
    std::string refusal;
  } cases[] = {
      {"the same", {with(2, {{"loss", 1.5}}), with(2, {{"loss", 1.5}})}, ""},
      {"keep_last", {with(1, {}), with(3, {})}, "rank 0: keep_last=1 keep_best=0"},
      {"last-bit noise", {with(1, {{"loss", 1.0}}), with(1, {{"loss", 1.0 + 1e-15}})}, ""},
      {"a rank's own loss", {with(1, {{"loss", 1.0}}), with(1, {{"loss", 2.0}})}, "the metric 'loss' differs between ranks (rank 0: loss=1; rank 1: loss=2)"},
      {"swapped values", {with(1, {{"a", 1}, {"b", 2}}), with(1, {{"a", 2}, {"b", 1}})}, "the metric 'a' differs"},
      {"NaN on one rank", {with(1, {{"loss", 2.0}}), with(1, {{"loss", std::nan("")}})}, "the metric 'loss' differs"},
      {"names that join alike", {with(1, {{"a, b", 1}}), with(1, {{"a", 1}, {"b", 1}})}, "retention rule, metrics or user metadata differ"},
      {"user metadata", {with(1, {}, {{"epoch", "1"}}), with(1, {}, {{"epoch", "2"}})}, "rank 1: keep_last=1 keep_best=0 metrics={} user_metadata={\"epoch\": \"2\"}"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> texts;
    std::vector<std::map<std::string, double>> metrics;
    for (const SaveOptions& o : c.ranks) {
      texts.push_back(AgreedOptionsText(o));
      metrics.push_back(o.metrics);
    }
    Status s = OptionConflicts(texts, metrics);
    if (c.refusal.empty()) {
      EXPECT_TRUE(s.ok()) << c.what << ": " << s.ToString();
    } else {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.what;
      EXPECT_THAT(s.message(), ::testing::HasSubstr(c.refusal)) << c.what;
    }
  }
}

TEST_F(SavePhasesOnDisk, ReuseNeedsTheSameWorldAndAKeptPlan) {
  SavePlanCache cache;
  EXPECT_FALSE(AgreeOnReuse(*comm_, 1, 42, &cache).value());  // nothing kept
  EXPECT_FALSE(AgreeOnReuse(*comm_, 1, 42, nullptr).value());
  PlannedSave planned = PlanOnRoot(0, root(), 1, Gathered(1), SaveOptions{});
  ASSERT_TRUE(planned.status.ok());
  KeepPlan(&cache, planned, 42, 1);
  EXPECT_TRUE(AgreeOnReuse(*comm_, 1, 42, &cache).value());
  EXPECT_FALSE(AgreeOnReuse(*comm_, 1, 43, &cache).value());  // this rank's description changed
  cache.world = 2;                                            // kept for another world
  EXPECT_FALSE(AgreeOnReuse(*comm_, 1, 42, &cache).value());
  cache.world = 1;
  planned.decoded = Internal("bad plan");  // a rank that could not read a plan drops its own
  KeepPlan(&cache, planned, 42, 1);
  EXPECT_EQ(cache.plan_id, 0);
  EXPECT_FALSE(AgreeOnReuse(*comm_, 1, 42, &cache).value());
}

}  // namespace
}  // namespace shardckpt::save_phases
