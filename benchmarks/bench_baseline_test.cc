// The baselines are tested for what they claim: fio's wrapper reads a real fio run, and a
// short read or a failed fio is an error, never a figure.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "benchmarks/bench_fio.h"
#include "benchmarks/bench_util.h"
#include "shardckpt/io/fs.h"

namespace shardckpt::bench {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class BaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/bench-baseline-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { RemoveTree(dir_).IgnoreError(); }
  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }
  std::string dir_;
};

TEST_F(BaselineTest, FioWritesAndReadsEveryJobsBytes) {
  std::vector<FioJob> writes = {{"rank0", Path("r0"), 2 * kMiB, true}, {"rank1", Path("r1"), 1 * kMiB, true}};
  Result<FioRun> w = RunFio(writes);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->jobs.size(), 2u);
  EXPECT_EQ(w->jobs[0].io_bytes, 2 * kMiB);
  EXPECT_EQ(w->jobs[1].io_bytes, 1 * kMiB);
  EXPECT_EQ(w->bytes, 3 * kMiB);
  EXPECT_GT(w->seconds, 0);
  EXPECT_GE(w->wall_s, w->seconds);
  EXPECT_EQ(FileSize(Path("r0")).value(), 2 * kMiB);
  EXPECT_NE(w->json.find("\"io_uring\""), std::string::npos);

  std::vector<FioJob> reads = writes;
  for (FioJob& j : reads) j.write = false;
  Result<FioRun> r = RunFio(reads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 3 * kMiB);
}

TEST_F(BaselineTest, FioReadOfAShortFileFailsAndLeavesItShort) {
  ASSERT_TRUE(RunFio({{"rank0", Path("r0"), 1 * kMiB, true}}).ok());
  Result<FioRun> r = RunFio({{"rank0", Path("r0"), 4 * kMiB, false}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find("short read"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(FileSize(Path("r0")).value(), 1 * kMiB);  // fio did not lay the file out to 4 MiB
}

TEST_F(BaselineTest, FioOutputWithFewerBytesThanAskedIsAShortRead) {
  Result<FioRun> w = RunFio({{"rank0", Path("r0"), 1 * kMiB, true}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Result<FioRun> read_back = RunFio({{"rank0", Path("r0"), 1 * kMiB, false}});
  ASSERT_TRUE(read_back.ok()) << read_back.status().ToString();
  // fio's real output, checked against a job that asked for more than fio moved.
  Result<FioRun> parsed = ParseFioJson(read_back->json, {{"rank0", Path("r0"), 2 * kMiB, false}});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kDataLoss);
  EXPECT_NE(parsed.status().message().find("moved 1048576 of 2097152 bytes (short read)"), std::string::npos)
      << parsed.status().ToString();
  EXPECT_TRUE(ParseFioJson(read_back->json, {{"rank0", Path("r0"), 1 * kMiB, false}}).ok());
  EXPECT_FALSE(ParseFioJson(read_back->json, {{"rank9", Path("r0"), 1 * kMiB, false}}).ok());
}

TEST_F(BaselineTest, FailedFioIsAnError) {
  // A job fio itself fails (its file is a folder): fio's error, not a rate.
  ASSERT_TRUE(MakeDirs(Path("folder")).ok());
  Result<FioRun> r = RunFio({{"rank0", Path("folder"), 1 * kMiB, true}});
  EXPECT_FALSE(r.ok());
  // fio that exits non-zero, and a "fio" that prints no JSON.
  FioSettings failing;
  failing.binary = "false";
  EXPECT_FALSE(RunFio({{"rank0", Path("r0"), 1 * kMiB, true}}, failing).ok());
  FioSettings silent;
  silent.binary = "true";
  Result<FioRun> none = RunFio({{"rank0", Path("r0"), 1 * kMiB, true}}, silent);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no JSON"), std::string::npos) << none.status().ToString();
  EXPECT_FALSE(ParseFioJson("{\"jobs\": [{\"jobname\": \"rank0\", \"error\": 5, \"read\": {\"io_bytes\": 1048576, "
                            "\"runtime\": 3}}]}",
                            {{"rank0", Path("r0"), 1 * kMiB, false}})
                   .ok());
}

TEST_F(BaselineTest, FioAsksForWholeBlocks) {
  EXPECT_EQ(FioBytes(256 * kMiB), 256 * kMiB);
  EXPECT_EQ(FioBytes(12 * kMiB), 8 * kMiB);       // fio would pad a read or drop a write's tail
  EXPECT_EQ(FioBytes(1 * kMiB + 100), 1 * kMiB);  // under one block: the block shrinks
}

TEST_F(BaselineTest, OldRawReadReportsAShortRead) {
  ASSERT_TRUE(RawDirectWrite(Path("raw"), 1 * kMiB).ok());
  EXPECT_TRUE(RawDirectRead(Path("raw"), 1 * kMiB).ok());
  Status short_read = RawDirectRead(Path("raw"), 3 * kMiB);
  ASSERT_FALSE(short_read.ok());
  EXPECT_EQ(short_read.code(), Code::kDataLoss);
  EXPECT_NE(short_read.message().find("short read"), std::string::npos) << short_read.ToString();
  EXPECT_FALSE(RawDirectRead(Path("missing"), 1 * kMiB).ok());
}

}  // namespace
}  // namespace shardckpt::bench
