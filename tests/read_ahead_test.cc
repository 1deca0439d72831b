// A load's read ahead of its own data file (engine/core/read_ahead.h): when it is worth it, that
// it reads the file's bytes, and that a load through it reads, verifies and reports as before.
#include "shardckpt/engine/core/read_ahead.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/fs.h"
#include "test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1u << 20;

TEST(WorthReadingAhead, OnlyASmallFileNextToALargeManifestAtTheSavedWorldSize) {
  struct Case {
    const char* what;
    ReadAheadHint hint;
    uint64_t file_bytes, max_bytes;
    bool expected;
  };
  const uint64_t m = kReadAheadMinManifestBytes;
  const Case cases[] = {
      {"small file, large manifest", {2 * kMiB, true}, 19 * kMiB, 64 * kMiB, true},
      {"file at the ratio", {2 * kMiB, true}, 32 * kMiB, 64 * kMiB, true},
      {"file past the ratio", {2 * kMiB, true}, 32 * kMiB + 4096, 64 * kMiB, false},
      {"file past the cap", {8 * kMiB, true}, 65 * kMiB, 64 * kMiB, false},
      {"turned off", {2 * kMiB, true}, 4096, 0, false},
      {"another world size", {2 * kMiB, false}, 19 * kMiB, 64 * kMiB, false},
      {"manifest at the minimum", {m, true}, 4096, 64 * kMiB, true},
      {"manifest under the minimum", {m - 1, true}, 4096, 64 * kMiB, false},
      {"no file", {2 * kMiB, true}, 0, 64 * kMiB, false},
      {"size off the 4096-byte grid", {2 * kMiB, true}, 4096 + 1, 64 * kMiB, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(WorthReadingAhead(c.hint, c.file_bytes, c.max_bytes), c.expected) << c.what;
  }
}

TEST(FileReadAhead, ReadsTheWholeFileOrNothing) {
  testing::TempDir dir;
  const std::string path = JoinPath(dir.path(), "rank-00000.bin");
  std::string bytes(17 * kMiB + 3 * 4096, '\0');  // three reads, the last short
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) >> 3);
  ASSERT_TRUE(WriteFileAtomic(path, bytes, "test").ok());
  const ReadAheadHint hint{4 * kMiB, true};
  std::string why;
  if (!testing::FastPathAvailable(dir.path(), &why)) {
    std::cout << "no read ahead here (" << why << "): only its refusal is checked\n";
    EXPECT_EQ(FileReadAhead::Start(path, hint, 64 * kMiB, IoOptions{}), nullptr);
    return;
  }
  std::unique_ptr<FileReadAhead> ahead = FileReadAhead::Start(path, hint, 64 * kMiB, IoOptions{});
  ASSERT_NE(ahead, nullptr);
  EXPECT_EQ(ahead->bytes(), bytes.size());
  const unsigned char* data = ahead->Wait();
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(std::memcmp(data, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(ahead->Wait(), data);  // once read, kept

  EXPECT_EQ(FileReadAhead::Start(path, hint, 16 * kMiB, IoOptions{}), nullptr);  // over the cap
  EXPECT_EQ(FileReadAhead::Start(path, ReadAheadHint{4 * kMiB, false}, 64 * kMiB, IoOptions{}), nullptr);
  EXPECT_EQ(FileReadAhead::Start(JoinPath(dir.path(), "rank-00001.bin"), hint, 64 * kMiB, IoOptions{}), nullptr);
  IoOptions posix;
  posix.use_io_uring = false;  // would read at submission, in the decode's way
  EXPECT_EQ(FileReadAhead::Start(path, hint, 64 * kMiB, posix), nullptr);
}

// A checkpoint of many small tensors saved by one rank: its manifest is past the minimum, its
// file far under 16 times that.
class ReadAheadLoad : public ::testing::Test {
 protected:
  static constexpr int kTensors = 4000;
  static constexpr int kElements = 16;

  void SetUp() override {
    saved_.resize(kTensors * kElements);
    for (size_t i = 0; i < saved_.size(); ++i) saved_[i] = static_cast<float>(i) * 0.5f;
    ShardedState state;
    for (int t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(state.AddTensor(Name(t), DType::kFloat32, {kElements}, Layout::Whole(), &saved_[t * kElements]).ok());
    }
    ASSERT_TRUE(Save(*comm_, root(), 7, state).ok());
    const std::string step = JoinPath(root(), StepDirName(7));
    ASSERT_GE(FileSize(JoinPath(step, kManifestName)).value(), kReadAheadMinManifestBytes);
    file_ = JoinPath(step, RankFileName(0));
  }
  static std::string Name(int t) { return "layers." + std::to_string(t) + ".norm.weight"; }
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }

  Result<LoadReport> LoadInto(std::vector<float>* into, const LoadOptions& options = {}) {
    into->assign(saved_.size(), -1.0f);
    ShardedState targets;
    for (int t = 0; t < kTensors; ++t) {
      Status added = targets.AddTensor(Name(t), DType::kFloat32, {kElements}, Layout::Whole(), &(*into)[t * kElements]);
      if (!added.ok()) return added;
    }
    return Load(*comm_, root(), targets, options);
  }

  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
  std::vector<float> saved_;
  std::string file_;
};

TEST_F(ReadAheadLoad, ASameWorldLoadReadsItsOwnFileAheadAndLoadsTheSameValues) {
  std::string why;
  const bool reads_ahead = testing::FastPathAvailable(dir_.path(), &why);
  if (!reads_ahead) std::cout << "no read ahead here (" << why << "): the load must read as before\n";
  std::vector<float> got;
  Result<LoadReport> report = LoadInto(&got);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(got, saved_);
  const uint64_t file_bytes = FileSize(file_).value();
  EXPECT_EQ(report->stats.bytes_read_ahead, reads_ahead ? file_bytes : 0u);
  if (reads_ahead) {
    EXPECT_EQ(report->stats.data_bytes_read, file_bytes);  // nothing read twice
  }
  // Again: its memory is the kept spare's, and its bytes are this load's.
  const uint64_t allocations = HostBufferAllocations();
  report = LoadInto(&got);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(got, saved_);
  EXPECT_EQ(report->stats.bytes_read_ahead, reads_ahead ? file_bytes : 0u);
  // Without a read ahead (tmpfs, no io_uring or O_DIRECT) the table page is read into a buffer
  // of its own, as before; with one, nothing is allocated.
  EXPECT_EQ(HostBufferAllocations(), allocations + (reads_ahead ? 0 : 1));

  LoadOptions off;
  off.read_ahead_max_bytes = 0;
  report = LoadInto(&got, off);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(got, saved_);
  EXPECT_EQ(report->stats.bytes_read_ahead, 0u);

  LoadOptions under_the_file;
  under_the_file.read_ahead_max_bytes = file_bytes - 4096;
  report = LoadInto(&got, under_the_file);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->stats.bytes_read_ahead, 0u);
}

// A read ahead that fails is dropped: the load reads the file again and loads the same values,
// never the buffer's bytes (fresh, or an earlier load's), verified or not.
TEST_F(ReadAheadLoad, AFailedReadAheadIsDroppedAndTheFileReadAgain) {
  std::string why;
  if (!testing::FastPathAvailable(dir_.path(), &why)) {
    std::cout << "no read ahead here (" << why << "): nothing to fail\n";
    return;
  }
  for (bool verify : {true, false}) {
    ReleaseSpareStaging();
    // The first completion through an engine in this load is the read ahead's (the manifest is
    // read without one).
    ASSERT_TRUE(SetFailpoints("io.read.complete#1=EIO").ok());
    LoadOptions options;
    options.verify_checksums = verify;
    std::vector<float> got;
    Result<LoadReport> report = LoadInto(&got, options);
    SetFailpoints("").IgnoreError();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(got, saved_) << "verify " << verify;
    EXPECT_EQ(report->stats.bytes_read_ahead, 0u);
    EXPECT_EQ(report->stats.data_bytes_read, FileSize(file_).value() - 4096);  // all but the table, read again
  }
}

// A read ahead whose second read fails, after its first (the file's tail, with the checksum
// table) landed and may have been taken: what it had stays valid, the rest is read from the file,
// and the load reads the same values.
TEST_F(ReadAheadLoad, AReadAheadThatFailsPartWayKeepsWhatItReadAndReadsTheRest) {
  std::string why;
  if (!testing::FastPathAvailable(dir_.path(), &why)) {
    std::cout << "no read ahead here (" << why << "): nothing to fail\n";
    return;
  }
  ReleaseSpareStaging();
  ASSERT_TRUE(SetFailpoints("io.read.complete#2=EIO").ok());
  std::vector<float> got;
  Result<LoadReport> report = LoadInto(&got);
  SetFailpoints("").IgnoreError();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(got, saved_);
  const uint64_t file_bytes = FileSize(file_).value();
  EXPECT_GT(report->stats.bytes_read_ahead, 0u);
  EXPECT_LT(report->stats.bytes_read_ahead, file_bytes);
}

// Its reads are waited for by range: the file's first and last bytes can be taken before the
// whole file is asked for, and each range's bytes are the file's.
TEST(FileReadAhead, WaitsForTheReadsThatHoldARange) {
  testing::TempDir dir;
  const std::string path = JoinPath(dir.path(), "rank-00000.bin");
  std::string bytes(5 * kMiB + 7 * 4096, '\0');  // five 1 MiB reads and the tail
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 167) >> 5);
  ASSERT_TRUE(WriteFileAtomic(path, bytes, "test").ok());
  std::string why;
  if (!testing::FastPathAvailable(dir.path(), &why)) {
    std::cout << "no read ahead here (" << why << ")\n";
    return;
  }
  std::unique_ptr<FileReadAhead> ahead = FileReadAhead::Start(path, ReadAheadHint{4 * kMiB, true}, 64 * kMiB, IoOptions{});
  ASSERT_NE(ahead, nullptr);
  const uint64_t n = bytes.size();
  struct Range {
    uint64_t offset, length;
  };
  for (const Range& r : {Range{n - 4096, 4096}, Range{0, 4096}, Range{kMiB - 4096, 8192}, Range{3 * kMiB, kMiB}}) {
    ASSERT_TRUE(ahead->WaitFor(r.offset, r.length)) << r.offset;
    EXPECT_EQ(std::memcmp(ahead->data() + r.offset, bytes.data() + r.offset, r.length), 0) << r.offset;
  }
  EXPECT_LE(ahead->bytes_completed(), n);
  EXPECT_FALSE(ahead->WaitFor(n, 4096));  // ranges not inside the file are never "arrived"
  EXPECT_FALSE(ahead->WaitFor(n - 4096, 8192));
  EXPECT_FALSE(ahead->WaitFor(UINT64_MAX - 4095, 8192));
  ASSERT_NE(ahead->Wait(), nullptr);
  EXPECT_EQ(ahead->bytes_completed(), n);
  EXPECT_EQ(std::memcmp(ahead->data(), bytes.data(), n), 0);

  // The third read to land fails: the two before it stay usable (whichever reads they were, each
  // block of them readable and the file's), every other block is refused, and the whole file is not
  // there.
  ReleaseSpareStaging();
  ASSERT_TRUE(SetFailpoints("io.read.complete#3=EIO").ok());
  ahead = FileReadAhead::Start(path, ReadAheadHint{4 * kMiB, true}, 64 * kMiB, IoOptions{});
  ASSERT_NE(ahead, nullptr);
  EXPECT_EQ(ahead->Wait(), nullptr);
  SetFailpoints("").IgnoreError();
  uint64_t usable = 0;
  for (uint64_t at = 0; at < n; at += 4096) {
    if (!ahead->WaitFor(at, 4096)) continue;
    usable += 4096;
    EXPECT_EQ(std::memcmp(ahead->data() + at, bytes.data() + at, 4096), 0) << at;
  }
  EXPECT_GT(usable, 0u);
  EXPECT_LT(usable, n);
  EXPECT_EQ(usable, ahead->bytes_completed());  // exactly the reads that landed before the failure
}

// A file of several reads, planned in extents of 256 KiB (four to a read): a read failing at each
// place in turn cuts the read ahead short, the extents it had not landed for are read from the
// file, and the values are the saved ones every time.
TEST(ReadAheadLoadLarger, AReadFailingInsideAnExtentHasThatExtentReadFromTheFile) {
  testing::TempDir dir;
  std::string why;
  if (!testing::FastPathAvailable(dir.path(), &why)) {
    std::cout << "no read ahead here (" << why << "): nothing to fail\n";
    return;
  }
  constexpr int kTensors = 4000, kElements = 256;  // 4 MiB of data: four 1 MiB reads and the tail
  std::vector<float> saved(kTensors * kElements);
  for (size_t i = 0; i < saved.size(); ++i) saved[i] = static_cast<float>(i % 100003) * 0.25f;
  auto name = [](int t) { return "layers." + std::to_string(t) + ".norm.weight"; };
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  const std::string root = JoinPath(dir.path(), "ckpt");
  ShardedState state;
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_TRUE(state.AddTensor(name(t), DType::kFloat32, {kElements}, Layout::Whole(), &saved[t * kElements]).ok());
  }
  ASSERT_TRUE(Save(*comm, root, 1, state).ok());
  const uint64_t file_bytes = FileSize(JoinPath(JoinPath(root, StepDirName(1)), RankFileName(0))).value();
  for (int failing = 0; failing <= 5; ++failing) {  // 0: none fails
    ReleaseSpareStaging();
    if (failing > 0) ASSERT_TRUE(SetFailpoints("io.read.complete#" + std::to_string(failing) + "=EIO").ok());
    std::vector<float> got(saved.size(), -1.0f);
    ShardedState targets;
    for (int t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(targets.AddTensor(name(t), DType::kFloat32, {kElements}, Layout::Whole(), &got[t * kElements]).ok());
    }
    LoadOptions options;
    options.plan.max_extent = 256u << 10;
    Result<LoadReport> report = Load(*comm, root, targets, options);
    SetFailpoints("").IgnoreError();
    ASSERT_TRUE(report.ok()) << failing << ": " << report.status().ToString();
    EXPECT_GE(report->stats.extents, 16u);
    EXPECT_EQ(got, saved) << "read " << failing << " failing";
    if (failing == 0) {
      EXPECT_EQ(report->stats.bytes_read_ahead, file_bytes);  // the whole file was read ahead
    } else {
      EXPECT_LT(report->stats.bytes_read_ahead, file_bytes) << failing;
      if (failing > 1) EXPECT_GT(report->stats.bytes_read_ahead, 0u) << failing;  // reads before it landed
    }
  }
}

// The bytes read ahead are verified like any read: a flipped byte names its tensor.
TEST_F(ReadAheadLoad, ADamagedByteInTheFileReadAheadNamesItsTensor) {
  const int victim = 2345;
  Manifest m = ReadManifest(JoinPath(root(), StepDirName(7))).value();
  uint64_t offset = 0;
  for (const EntryRecord& e : m.entries) {
    if (e.name == Name(victim)) offset = e.chunks[0].offset;
  }
  std::string bytes = ReadFileLimited(file_, 64 * kMiB).value();
  bytes[offset + 5] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(file_, bytes, "test").ok());
  std::vector<float> got;
  Status status = LoadInto(&got).status();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr(RankFileName(0) + ": checksum mismatch"));
  EXPECT_THAT(status.message(), HasSubstr("'" + Name(victim) + "'"));
}

}  // namespace
}  // namespace shardckpt
