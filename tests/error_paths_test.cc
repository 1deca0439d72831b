// Error paths of the smaller promises: new directories are durable, negative steps are refused,
// an oversized gather is refused by the same rule on every rank, and verify lists every problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

class ErrorPaths : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  TempDir dir_;
};

TEST_F(ErrorPaths, MakeDirsSyncsTheParentOfEachNewDirectory) {
  const std::string root = JoinPath(JoinPath(dir_.path(), "new"), "root");
  ASSERT_TRUE(SetFailpoints("fs.mkdirs.sync_parent=EIO").ok());
  Status made = MakeDirs(root);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.code(), Code::kIoError);
  // The first directory made is dir/new; its entry lives in dir.
  EXPECT_THAT(made.message(), HasSubstr("fsync directory " + dir_.path()));
  EXPECT_THAT(made.message(), HasSubstr("fs.mkdirs.sync_parent"));

  // Nothing new to make: nothing to sync, so the armed failpoint does not fire.
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_TRUE(MakeDirs(root).ok());
  ASSERT_TRUE(IsDirectory(root));
  ASSERT_TRUE(SetFailpoints("fs.mkdirs.sync_parent=EIO").ok());
  EXPECT_TRUE(MakeDirs(root).ok());
  EXPECT_TRUE(MakeDirs(root + "/").ok());
  // A path through a file is an error naming it.
  std::ofstream(JoinPath(dir_.path(), "file")) << "x";
  Status through_file = MakeDirs(JoinPath(JoinPath(dir_.path(), "file"), "sub"));
  ASSERT_FALSE(through_file.ok());
  EXPECT_THAT(through_file.message(), HasSubstr(JoinPath(dir_.path(), "file") + ": exists and is not a directory"));
}

TEST_F(ErrorPaths, NegativeStepsAreRefusedBeforeTheRootIsTouched) {
  const std::string root = JoinPath(dir_.path(), "root");
  std::vector<float> values(6, 1.0f);
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("w", DType::kFloat32, {2, 3}, Layout::Whole(), values.data()).ok());
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  Result<SaveResult> saved = Save(*comm, root, -1, state);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(saved.status().message(), HasSubstr("step -1 is negative"));
  EXPECT_FALSE(PathExists(root));

  Result<std::unique_ptr<OfflineCheckpointWriter>> offline = OfflineCheckpointWriter::Begin(root, -7, 2);
  ASSERT_FALSE(offline.ok());
  EXPECT_EQ(offline.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(offline.status().message(), HasSubstr("step -7 is negative"));

  EXPECT_TRUE(Save(*comm, root, 0, state).ok());  // 0 is a step like any other
}

TEST(MergeRankStatuses, RanksWithTheSameCauseAreNamedTogether) {
  const Status ok = Status::Ok();
  const Status disk = Status(Code::kNoSpace, "write rank file: No space left on device");
  const Status io = Status(Code::kIoError, "read manifest.json: EIO");
  struct Case {
    std::vector<Status> by_rank;
    Code code;
    const char* message;  // "" when every rank succeeded
  };
  const Case kCases[] = {
      {{ok, ok, ok}, Code::kOk, ""},
      {{ok, ok, disk}, Code::kNoSpace, "rank 2: write rank file: No space left on device"},
      {{disk, disk, disk, disk}, Code::kNoSpace, "ranks 0-3: write rank file: No space left on device"},
      {{io, disk, disk, ok, disk, io, io, io},
       Code::kIoError,
       "ranks 0, 5-7: read manifest.json: EIO; ranks 1-2, 4: NoSpace: write rank file: No space left on device"},
      {{ok, disk, ok, disk}, Code::kNoSpace, "ranks 1, 3: write rank file: No space left on device"},
      // A cause without a message is named by its code.
      {{Status(Code::kAborted, ""), Status(Code::kAborted, ""), io}, Code::kAborted, "ranks 0-1: Aborted; rank 2: IoError: read manifest.json: EIO"},
  };
  for (const Case& c : kCases) {
    Status merged = MergeRankStatuses(c.by_rank);
    EXPECT_EQ(merged.code(), c.code) << c.message;
    EXPECT_EQ(merged.message(), c.message);
  }
}

TEST(GatherSizes, RefusesOversizedMessagesAndTotalsNamingTheRank) {
  struct Case {
    std::vector<int64_t> lengths;
    int64_t limit;
    const char* error;  // "" when it fits
  };
  const Case kCases[] = {
      {{}, 100, ""},
      {{10, 20, 70}, 100, ""},
      {{100}, 100, ""},
      {{10, 101, 0}, 100, "rank 1 sends 101 bytes"},
      {{60, 30, 11}, 100, "101 bytes from ranks 0..2 together"},
      {{0, 0, int64_t{3} << 30}, (int64_t{1} << 31) - 1, "rank 2 sends 3221225472 bytes"},
      {{int64_t{1} << 30, int64_t{1} << 30}, (int64_t{1} << 31) - 1, "2147483648 bytes from ranks 0..1"},
  };
  for (const Case& c : kCases) {
    Status status = CheckGatherSizes(c.lengths, c.limit);
    if (*c.error == '\0') {
      EXPECT_TRUE(status.ok()) << status.ToString();
      continue;
    }
    ASSERT_FALSE(status.ok()) << c.error;
    EXPECT_EQ(status.code(), Code::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.error));
  }
}

// Two damaged files: the first's checksum table cannot be read, the second has a flipped data
// byte. Both are listed; verify does not stop at the first.
TEST_F(ErrorPaths, VerifyListsEveryDamagedFile) {
  const std::string root = JoinPath(dir_.path(), "root");
  {
    auto out = OfflineCheckpointWriter::Begin(root, 1, 2);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const Shape shape = {4096};
    for (int r = 0; r < 2; ++r) {
      Layout layout = FlatShardLayout(shape, 2, r);
      std::vector<uint8_t> bytes = testing::PieceBytes("w", DType::kFloat32, shape, layout);
      ASSERT_TRUE((*out)->AddPiece(r, "w", DType::kFloat32, shape, layout, bytes.data(), bytes.size()).ok());
    }
    ASSERT_TRUE((*out)->Commit(MakeCreationInfo(1, "", "", {})).ok());
  }
  const std::string ckpt = JoinPath(root, "step-000000001");
  {
    std::fstream f(JoinPath(ckpt, "rank-00001.bin"), std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    f.seekg(100);
    f.get(byte);
    f.seekp(100);
    f.put(static_cast<char>(~byte));
  }
  // The first read verify makes is file 0's checksum table page.
  ASSERT_TRUE(SetFailpoints("io.read#1=EIO").ok());
  Result<VerifyReport> report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->files, 2u);
  ASSERT_EQ(report->problems.size(), 2u);
  EXPECT_EQ(report->problems[0].file, "rank-00000.bin");
  EXPECT_THAT(report->problems[0].what, HasSubstr("checksum table page 0 cannot be read"));
  EXPECT_THAT(report->problems[0].what, HasSubstr("injected at failpoint io.read"));
  EXPECT_THAT(report->problems[0].entries, ElementsAre("w"));
  // A read that failed tells nothing of the bytes (the tool says UNREADABLE, not DAMAGED, for a
  // checkpoint with only such problems); a mismatch is damage.
  EXPECT_TRUE(report->problems[0].unreadable);
  EXPECT_EQ(report->problems[1].file, "rank-00001.bin");
  EXPECT_EQ(report->problems[1].offset, 0u);
  EXPECT_THAT(report->problems[1].what, HasSubstr("checksum mismatch"));
  EXPECT_THAT(report->problems[1].entries, ElementsAre("w"));
  EXPECT_EQ(HoldersText(report->problems[1]), "'w'");
  EXPECT_FALSE(report->problems[1].unreadable);
  // Every read failing (a permission, a failing disk): each file's problem is unreadable alone.
  ASSERT_TRUE(SetFailpoints("io.read=EIO").ok());
  report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 2u);
  for (const VerifyProblem& p : report->problems) EXPECT_TRUE(p.unreadable) << p.file << ": " << p.what;
  ASSERT_TRUE(SetFailpoints("").ok());
  // A missing file is damage, not a read that failed.
  ASSERT_EQ(::unlink(JoinPath(ckpt, "rank-00001.bin").c_str()), 0);
  report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_THAT(report->problems[0].what, HasSubstr("missing"));
  EXPECT_FALSE(report->problems[0].unreadable);
}

// A file cut inside its checksum table: the blocks whose sums were cut off are named by their
// entries, not as "padding", and the blocks the remaining pages sum are still checked. Extra
// bytes after the table are named, and the file checked too.
TEST_F(ErrorPaths, VerifyOfAFileCutInItsTableNamesTheUnverifiableEntriesAndChecksTheRest) {
  const std::string root = JoinPath(dir_.path(), "root");
  // "a" fills the blocks of table page 0 (512 blocks of 4096 bytes), "b" begins on page 1.
  const Shape a_shape = {int64_t{kSumsPerTablePage * kBlockSize / 4}}, b_shape = {4096};
  {
    auto out = OfflineCheckpointWriter::Begin(root, 1, 1);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    for (const auto& [name, shape] : {std::pair{"a", a_shape}, std::pair{"b", b_shape}}) {
      Layout whole = FlatShardLayout(shape, 1, 0);
      std::vector<uint8_t> bytes = testing::PieceBytes(name, DType::kFloat32, shape, whole);
      ASSERT_TRUE((*out)->AddPiece(0, name, DType::kFloat32, shape, whole, bytes.data(), bytes.size()).ok());
    }
    ASSERT_TRUE((*out)->Commit(MakeCreationInfo(1, "", "", {})).ok());
  }
  const std::string file = JoinPath(root, "step-000000001/rank-00000.bin");
  const uint64_t size = FileSize(file).value();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');  // in "a", whose sums are on the page that stays
  }
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(size - kBlockSize)), 0);
  Result<VerifyReport> report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 2u);
  EXPECT_THAT(report->problems[0].what, HasSubstr("truncated in its checksum table"));
  EXPECT_THAT(report->problems[0].what, HasSubstr("from offset " + std::to_string(kSumsPerTablePage * kBlockSize)));
  EXPECT_EQ(HoldersText(report->problems[0]), "'b'");
  EXPECT_EQ(report->problems[1].offset, 0u);
  EXPECT_THAT(report->problems[1].what, HasSubstr("checksum mismatch"));
  EXPECT_EQ(HoldersText(report->problems[1]), "'a'");
  EXPECT_EQ(report->blocks_checked, kSumsPerTablePage);
  EXPECT_EQ(report->bytes_checked, kSumsPerTablePage * kBlockSize);

  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(size + 10)), 0);  // the page back as zeros, and 10 more
  report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_GE(report->problems.size(), 2u);
  EXPECT_THAT(report->problems[0].what, HasSubstr("(extra bytes after its checksum table)"));
  EXPECT_EQ(report->problems[0].offset, size);
  EXPECT_EQ(HoldersText(report->problems[0]), "past the end");
  // The zeroed page no longer matches the manifest: its blocks ("b") are named once.
  EXPECT_THAT(report->problems[1].what, HasSubstr("checksum table page 1 does not match the manifest"));
  EXPECT_EQ(HoldersText(report->problems[1]), "'b'");

  // Cut at its table: nothing can be checked, and nothing is read or counted as checked.
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(size - 2 * kBlockSize)), 0);
  report = VerifyCheckpoint(root);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(HoldersText(report->problems[0]), "'a', 'b'");
  EXPECT_EQ(report->blocks_checked, 0u);
  EXPECT_EQ(report->bytes_checked, 0u);
  EXPECT_FALSE(report->dcp);
}

}  // namespace
}  // namespace shardckpt
