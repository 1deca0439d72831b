// One conformance suite over every IoEngine: {io_uring, posix} x {O_DIRECT, buffered} x
// {normal, forced short transfers}. Each case checks the bytes it reads back.
#include "shardckpt/io/io_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <tuple>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

using Param = std::tuple<bool /*uring*/, bool /*direct*/, bool /*short*/>;

class IoEngineConformance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto [uring, direct, cut] = GetParam();
    IoOptions options;
    options.queue_depth = 4;
    options.use_direct = direct;
    options.simulate_short_transfers = cut;
    if (uring) {
      Result<std::unique_ptr<IoEngine>> engine = CreateUringEngine(options);
      if (!engine.ok()) GTEST_SKIP() << "io_uring unavailable here: " << engine.status().ToString();
      engine_ = std::move(engine).value();
    } else {
      engine_ = CreatePosixEngine(options);
    }
  }
  void TearDown() override { SetFailpoints("").IgnoreError(); }

  std::unique_ptr<IoEngine> engine_;
  testing::TempDir dir_;
};

void Fill(AlignedBuffer& buffer, uint8_t seed) {
  for (size_t i = 0; i < buffer.size(); ++i) buffer.data()[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
}

TEST_P(IoEngineConformance, WritesAndReadsBackWithQueueFull) {
  const std::string path = JoinPath(dir_.path(), "data");
  constexpr size_t kBuffers = 8, kBytes = 64 << 10;
  std::vector<AlignedBuffer> out, in;
  for (size_t i = 0; i < kBuffers; ++i) {
    out.push_back(AlignedBuffer::Allocate(kBytes).value());
    in.push_back(AlignedBuffer::Allocate(kBytes).value());
    Fill(out.back(), static_cast<uint8_t>(i));
  }
  {
    auto file = engine_->Open(path, OpenMode::kCreate).value();
    std::set<uint64_t> done;
    // Reverse order: positioned writes must not depend on submission order.
    for (size_t i = kBuffers; i-- > 0;) {
      while (engine_->in_flight() >= engine_->queue_depth()) done.insert(engine_->Reap().value());
      ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, i * kBytes, out[i].data(), kBytes}, i).ok());
    }
    while (engine_->in_flight() > 0) done.insert(engine_->Reap().value());
    EXPECT_EQ(done.size(), kBuffers);  // every tag exactly once
    ASSERT_TRUE(engine_->Sync(file.get()).ok());
    EXPECT_EQ(*file->Size(), kBuffers * kBytes);
  }
  auto file = engine_->Open(path, OpenMode::kRead).value();
  for (size_t i = 0; i < kBuffers; ++i) {
    while (engine_->in_flight() >= engine_->queue_depth()) ASSERT_TRUE(engine_->Reap().ok());
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kRead, i * kBytes, in[i].data(), kBytes}, i).ok());
  }
  ASSERT_TRUE(engine_->Drain().ok());
  for (size_t i = 0; i < kBuffers; ++i) {
    ASSERT_EQ(std::memcmp(in[i].data(), out[i].data(), kBytes), 0) << "buffer " << i;
  }
}

TEST_P(IoEngineConformance, ReadPastEndOfFileIsDataLossNamingTheFile) {
  const std::string path = JoinPath(dir_.path(), "short");
  AlignedBuffer buffer = AlignedBuffer::Allocate(16384).value();
  Fill(buffer, 3);
  {
    auto file = engine_->Open(path, OpenMode::kCreate).value();
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), 8192}, 1).ok());
    ASSERT_TRUE(engine_->Drain().ok());
  }
  auto file = engine_->Open(path, OpenMode::kRead).value();
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kRead, 0, buffer.data(), 16384}, 1).ok());
  Result<uint64_t> reaped = engine_->Reap();
  ASSERT_FALSE(reaped.ok());
  EXPECT_EQ(reaped.status().code(), Code::kDataLoss);
  EXPECT_THAT(reaped.status().message(), HasSubstr(path));
  EXPECT_THAT(reaped.status().message(), HasSubstr("end of file at offset 8192"));
  EXPECT_EQ(engine_->in_flight(), 0u);
}

TEST_P(IoEngineConformance, InjectedErrorsNameTheFileAndCause) {
  const std::string path = JoinPath(dir_.path(), "full");
  AlignedBuffer buffer = AlignedBuffer::Allocate(4096).value();
  auto file = engine_->Open(path, OpenMode::kCreate).value();
  ASSERT_TRUE(SetFailpoints("io.write#2=ENOSPC;io.fsync=EIO").ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), 4096}, 1).ok());
  Status second = engine_->Submit(file.get(), IoOp{IoKind::kWrite, 4096, buffer.data(), 4096}, 2);
  EXPECT_EQ(second.code(), Code::kNoSpace);
  EXPECT_THAT(second.message(), HasSubstr(path + " at offset 4096"));
  ASSERT_TRUE(engine_->Drain().ok());
  Status sync = engine_->Sync(file.get());
  EXPECT_EQ(sync.code(), Code::kIoError);
  EXPECT_THAT(sync.message(), HasSubstr("fdatasync " + path));
}

TEST_P(IoEngineConformance, OpenMissingFileIsNotFound) {
  Result<std::unique_ptr<File>> file = engine_->Open(JoinPath(dir_.path(), "nope"), OpenMode::kRead);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), Code::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("nope"));
}

INSTANTIATE_TEST_SUITE_P(AllEngines, IoEngineConformance,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::get<0>(info.param) ? "uring" : "posix") +
                                  (std::get<1>(info.param) ? "_direct" : "_buffered") +
                                  (std::get<2>(info.param) ? "_short" : "_full");
                         });

TEST(CreateIoEngine, FallsBackToPosixWhenUringIsNotWanted) {
  IoOptions options;
  options.use_io_uring = false;
  EXPECT_STREQ(CreateIoEngine(options)->name(), "posix");
}

TEST(Failpoints, RejectUnknownActions) {
  EXPECT_FALSE(SetFailpoints("x=EWHATEVER").ok());
  EXPECT_FALSE(SetFailpoints("novalue").ok());
  EXPECT_TRUE(SetFailpoints("").ok());
}

}  // namespace
}  // namespace shardckpt
