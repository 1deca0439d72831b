// One conformance suite over every IoEngine: {io_uring, posix} x {O_DIRECT, buffered} x
// {normal, forced short transfers}. Each case checks the bytes it reads back; "direct" cases
// check that the kernel really has O_DIRECT on the file wherever the file system allows it.
#include "shardckpt/io/io_engine.h"

#include <chrono>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/read_ring.h"
#include "shardckpt/io/sequential_writer.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::DirectIoAvailable;
using testing::FdHasODirect;
using testing::UringAvailable;

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
      if (!engine.ok()) {
        std::string why;
        ASSERT_FALSE(UringAvailable(&why)) << "io_uring works here, yet the engine refused it: "
                                           << engine.status().ToString();
        GTEST_SKIP() << "io_uring unavailable here: " << why;
      }
      engine_ = std::move(engine).value();
    } else {
      engine_ = CreatePosixEngine(options);
    }
  }
  void TearDown() override { SetFailpoints("").IgnoreError(); }

  bool uring() const { return std::get<0>(GetParam()); }
  // Opens a file of this test's folder, checking that the engine's belief and the kernel's flags
  // agree, and that O_DIRECT was asked for and granted wherever the file system takes it.
  std::unique_ptr<File> Open(const std::string& path, OpenMode mode) {
    Result<std::unique_ptr<File>> file = engine_->Open(path, mode);
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    if (!file.ok()) return nullptr;
    ExpectOpenMode(**file);
    return std::move(file).value();
  }
  void ExpectOpenMode(const File& file) {
    EXPECT_EQ(file.direct(), FdHasODirect(file.fd())) << file.path();
    std::string why;
    if (std::get<1>(GetParam()) && DirectIoAvailable(dir_.path(), &why)) {
      EXPECT_TRUE(FdHasODirect(file.fd())) << file.path() << " was opened without O_DIRECT";
    }
    if (!std::get<1>(GetParam())) {
      EXPECT_FALSE(FdHasODirect(file.fd())) << file.path();
    }
  }

  std::unique_ptr<IoEngine> engine_;
  testing::TempDir dir_;
};

void Fill(AlignedBuffer& buffer, uint8_t seed) {
  for (size_t i = 0; i < buffer.size(); ++i) buffer.data()[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
}

uint64_t Transfers(const IoUsage& u) { return u.uring_direct + u.uring_buffered + u.posix_direct + u.posix_buffered; }

// Reaps everything in flight: the tags that completed and the errors of those that did not.
void ReapAll(IoEngine* engine, std::set<uint64_t>* done, std::vector<Status>* failures) {
  while (engine->in_flight() > 0) {
    Result<uint64_t> tag = engine->Reap();
    if (tag.ok()) done->insert(*tag);
    else failures->push_back(tag.status());
  }
}

// The VmFlags of the mapping holding `address`, from /proc/self/smaps ("" when not found).
std::string VmFlagsOf(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find('-') < line.find(' ')) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Host buffers of a huge page and more get a mapping of their own, aligned to the huge page and
// advised for transparent huge pages (VmFlags "hg"); smaller ones come from the heap, and so do
// large ones once huge pages are turned off. Freeing a large one unmaps it.
// A sandbox may refuse the advice: then the allocator only logs, and there is nothing to see.
bool HugePageAdviceTaken(size_t page) {
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return false;
  const bool advised = madvise(probe, page, MADV_HUGEPAGE) == 0;
  munmap(probe, page);
  return advised;
}

TEST(AlignedBufferTest, LargeBuffersAskForHugePagesUnlessTurnedOff) {
  const size_t page = HugePageStagingBytes();
  if (page == 0) GTEST_SKIP() << "no transparent huge pages here (or SHARDCKPT_HUGE_PAGES=0)";
  if (!HugePageAdviceTaken(page)) GTEST_SKIP() << "madvise(MADV_HUGEPAGE) refused here";
  const size_t bytes = 4 * page;
  void* address = nullptr;
  {
    AlignedBuffer large = AlignedBuffer::Allocate(bytes).value();
    address = large.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % page, 0u);
    EXPECT_THAT(VmFlagsOf(large.data()), HasSubstr(" hg"));
    std::memset(large.data(), 1, large.size());  // usable whole
  }
  EXPECT_EQ(VmFlagsOf(address), "");  // unmapped, not left to the heap with the advice on it
  AlignedBuffer small = AlignedBuffer::Allocate(64u << 10).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % kDirectIoAlignment, 0u);
  EXPECT_THAT(VmFlagsOf(small.data()), Not(HasSubstr(" hg")));

  SetHugePageStaging(false);
  EXPECT_EQ(HugePageStagingBytes(), 0u);
  AlignedBuffer plain = AlignedBuffer::Allocate(bytes).value();
  SetHugePageStaging(true);
  EXPECT_EQ(HugePageStagingBytes(), page);
  EXPECT_THAT(VmFlagsOf(plain.data()), Not(HasSubstr(" hg")));
  EXPECT_THAT(VmFlagsOf(plain.data()), HasSubstr("VmFlags:"));
}

// Memory used often is on the default's huge pages; memory used a few times is on small pages
// where fresh huge pages are costly (this project's VMs), else on huge pages too. A small-page
// buffer of any size is never advised.
TEST(AlignedBufferTest, OnlyMemoryUsedOftenAsksForHugePages) {
  const size_t page = HugePageStagingBytes();
  if (page == 0) GTEST_SKIP() << "no transparent huge pages here (or SHARDCKPT_HUGE_PAGES=0)";
  if (!HugePageAdviceTaken(page)) GTEST_SKIP() << "madvise(MADV_HUGEPAGE) refused here";
  const size_t bytes = 4 * page;
  struct Case {
    uint64_t bytes_through;
    bool huge;
  };
  const bool one_off_huge = !FreshHugePagesCostly();
  for (const Case& c : {Case{0, true}, Case{bytes, one_off_huge}, Case{kHugePageReuse * bytes - 1, one_off_huge},
                        Case{kHugePageReuse * bytes, true}, Case{uint64_t{1} << 40, true}}) {
    AlignedBuffer buffer = AlignedBuffer::Allocate(bytes, AllocatorForReuse(c.bytes_through, bytes)).value();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kDirectIoAlignment, 0u) << c.bytes_through;
    EXPECT_EQ(VmFlagsOf(buffer.data()).find(" hg") != std::string::npos, c.huge) << c.bytes_through;
    std::memset(buffer.data(), 1, buffer.size());  // usable whole
  }
  AlignedBuffer one_off = AlignedBuffer::Allocate(bytes, OneOffHostAllocator()).value();
  EXPECT_EQ(VmFlagsOf(one_off.data()).find(" hg") != std::string::npos, one_off_huge);
  void* address = nullptr;
  {
    AlignedBuffer small_pages = AlignedBuffer::Allocate(bytes, SmallPageHostAllocator()).value();
    address = small_pages.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small_pages.data()) % kDirectIoAlignment, 0u);
    // Advised against huge pages, so also where THP is "always".
    EXPECT_THAT(VmFlagsOf(small_pages.data()), HasSubstr(" nh"));
    EXPECT_THAT(VmFlagsOf(small_pages.data()), Not(HasSubstr(" hg")));
    std::memset(small_pages.data(), 1, small_pages.size());
  }
  EXPECT_EQ(VmFlagsOf(address), "");  // unmapped: given back, not kept in the heap
}

// The manifest's seal is hashed over pieces that stand apart: a head, a kept body, a closing brace.
TEST(Checksum64, PiecesAreTheChecksumOfThemJoined) {
  std::string text(3000, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 131 + (i >> 7));
  const std::string_view all(text);
  for (size_t split : {size_t{0}, size_t{1}, size_t{240}, size_t{1024}, size_t{2999}, size_t{3000}}) {
    EXPECT_EQ(Checksum64({all.substr(0, split), all.substr(split)}), Checksum64(text.data(), text.size())) << split;
    const size_t second = std::min(split + 700, text.size());
    EXPECT_EQ(Checksum64({all.substr(0, split), "", all.substr(split, second - split), all.substr(second)}),
              Checksum64(text.data(), text.size()))
        << split;
  }
  EXPECT_NE(Checksum64({"ab", "c"}), Checksum64("abd", 3));
}

// Checksum64 may run libxxhash's AVX2/AVX-512 code (io/checksum.cc); every file ever written
// holds the values of XXH3 as specified, which the library's plain entry point computes.
TEST(Checksum64, IsXxh3AsSpecifiedAtEveryLengthAndAlignment) {
  // xxHash's own sanity vectors (XXH3_64bits, seed 0): its generated buffer, one length per code
  // path, 241 bytes the first of the long, vectorized one.
  std::vector<unsigned char> sanity(241);
  uint64_t generator = 0x9E3779B1u;  // PRIME32, multiplied by PRIME64 byte by byte
  for (unsigned char& b : sanity) {
    b = static_cast<unsigned char>(generator >> 56);
    generator *= 0x9E3779B185EBCA8Dull;
  }
  const std::pair<size_t, uint64_t> vectors[] = {
      {0, 0x2D06800538D394C2ull},   {1, 0xC44BDFF4074EECDBull},   {6, 0x27B56A84CD2D7325ull},
      {12, 0xA713DAF0DFBB77E7ull},  {24, 0xA3FE70BF9D3510EBull},  {48, 0x397DA259ECBA1F11ull},
      {80, 0xBCDEFBBB2C47C90Aull},  {128, 0xFCFF24126754D861ull}, {240, 0x81C3C2B67F568CCFull},
      {241, 0xC5A639ECD2030E5Eull},
  };
  for (const auto& [length, expected] : vectors) EXPECT_EQ(Checksum64(sanity.data(), length), expected) << length;
  std::vector<unsigned char> bytes(3 * kBlockSize + 64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + (i >> 9));
  for (size_t shift : {size_t{0}, size_t{1}, size_t{7}, size_t{32}}) {
    for (size_t len = 0; len + shift <= bytes.size(); len += (len < 300 ? 1 : 97)) {
      ASSERT_EQ(Checksum64(bytes.data() + shift, len), XXH3_64bits(bytes.data() + shift, len)) << len << " at +" << shift;
    }
  }
  uint64_t sums[3];
  ChecksumBlocks(bytes.data(), 3 * kBlockSize, sums);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(sums[b], XXH3_64bits(bytes.data() + b * kBlockSize, kBlockSize)) << b;
  const std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_EQ(Checksum64({all.substr(0, 5000), all.substr(5000)}), XXH3_64bits(bytes.data(), bytes.size()));
}

TEST(BufferPool, AnEmptyPoolIsRefusedNamingTheOptions) {
  for (auto [count, bytes] : {std::pair<size_t, size_t>{0, 4096}, {4, 0}}) {
    Result<std::unique_ptr<BufferPool>> pool = BufferPool::Create(count, bytes);
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(pool.status().message(), ::testing::HasSubstr("staging_buffers / staging_buffer_bytes"));
  }
  EXPECT_TRUE(BufferPool::Create(1, 1).ok());
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
    auto file = Open(path, OpenMode::kCreate);
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
  auto file = Open(path, OpenMode::kRead);
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
    auto file = Open(path, OpenMode::kCreate);
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), 8192}, 1).ok());
    ASSERT_TRUE(engine_->Drain().ok());
  }
  auto file = Open(path, OpenMode::kRead);
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
  auto file = Open(path, OpenMode::kCreate);
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

// Errors the kernel reports at completion, after the request was accepted: only the operation
// they hit fails, named with its file, offset and cause, and nothing stays in flight.
TEST_P(IoEngineConformance, AnErrorAtCompletionFailsThatOperationOnly) {
  const std::string path = JoinPath(dir_.path(), "failing");
  AlignedBuffer buffer = AlignedBuffer::Allocate(3 * 4096).value();
  Fill(buffer, 5);
  {
    auto file = Open(path, OpenMode::kCreate);
    ASSERT_TRUE(SetFailpoints("io.write.complete#2=EIO").ok());
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, i * 4096, buffer.data() + i * 4096, 4096}, i).ok());
    }
    std::set<uint64_t> done;
    std::vector<Status> failures;
    ReapAll(engine_.get(), &done, &failures);
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_EQ(done.size(), 2u);
    EXPECT_EQ(failures[0].code(), Code::kIoError);
    EXPECT_THAT(failures[0].message(), HasSubstr("write " + path + " at offset "));
    EXPECT_THAT(failures[0].message(), HasSubstr("[injected at failpoint io.write.complete]"));
    ASSERT_TRUE(SetFailpoints("").ok());
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, i * 4096, buffer.data() + i * 4096, 4096}, i).ok());
    }
    ASSERT_TRUE(engine_->Drain().ok());
  }
  auto file = Open(path, OpenMode::kRead);
  AlignedBuffer in = AlignedBuffer::Allocate(4096).value();
  ASSERT_TRUE(SetFailpoints("io.read.complete=ENOSPC").ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kRead, 8192, in.data(), 4096}, 9).ok());
  Result<uint64_t> reaped = engine_->Reap();
  ASSERT_FALSE(reaped.ok());
  EXPECT_EQ(reaped.status().code(), Code::kNoSpace);
  EXPECT_THAT(reaped.status().message(), HasSubstr("read " + path + " at offset 8192"));
  EXPECT_THAT(reaped.status().message(), HasSubstr("[injected at failpoint io.read.complete]"));
  EXPECT_EQ(engine_->in_flight(), 0u);
}

// The kernel may stop any transfer early; every completion here is cut in half, and the bytes
// still arrive whole, in both directions.
TEST_P(IoEngineConformance, ShortTransfersAtCompletionAreResumed) {
  const std::string path = JoinPath(dir_.path(), "cut");
  AlignedBuffer out = AlignedBuffer::Allocate(64 << 10).value();
  AlignedBuffer in = AlignedBuffer::Allocate(64 << 10).value();
  Fill(out, 11);
  ASSERT_TRUE(SetFailpoints("io.write.complete=short;io.read.complete=short").ok());
  const uint64_t before = Transfers(ProcessIoUsage());
  {
    auto file = Open(path, OpenMode::kCreate);
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, out.data(), out.size()}, 1).ok());
    ASSERT_TRUE(engine_->Drain().ok());
  }
  auto file = Open(path, OpenMode::kRead);
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kRead, 0, in.data(), in.size()}, 2).ok());
  ASSERT_TRUE(engine_->Drain().ok());
  // 64 KiB halved down to one block is 5 transfers each way (more when not O_DIRECT).
  EXPECT_GE(Transfers(ProcessIoUsage()) - before, 10u) << "the cuts did not happen";
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

// A resubmission of the rest of a short transfer that io_uring_submit refuses fails that
// operation and frees its slot: Drain and the destructor return instead of waiting for a
// completion that will never come, and the slot serves the next operation.
TEST_P(IoEngineConformance, AFailedResubmissionFreesItsSlot) {
  if (!uring()) GTEST_SKIP() << "pread/pwrite resubmit inside Submit";
  const std::string path = JoinPath(dir_.path(), "resubmit");
  AlignedBuffer buffer = AlignedBuffer::Allocate(64 << 10).value();
  Fill(buffer, 13);
  auto file = Open(path, OpenMode::kCreate);
  ASSERT_TRUE(SetFailpoints("io.write.complete#1=short;io.uring_submit#2=EAGAIN").ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), buffer.size()}, 7).ok());
  Result<uint64_t> reaped = engine_->Reap();
  ASSERT_FALSE(reaped.ok());
  EXPECT_EQ(reaped.status().code(), Code::kIoError);
  EXPECT_THAT(reaped.status().message(), HasSubstr("io_uring_submit: write " + path + " at offset 0"));
  EXPECT_EQ(engine_->in_flight(), 0u);
  EXPECT_TRUE(engine_->Drain().ok());
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), buffer.size()}, 8).ok());
  EXPECT_EQ(engine_->Reap().value(), 8u);
}

// io_uring_wait_cqe fails with nothing reaped. A busy ring (EBUSY) is waited out and every
// operation still lands; a wait that fails otherwise ends the process with a message, instead of
// spinning for ever (before) or returning while the kernel may still write into the buffers.
TEST_P(IoEngineConformance, AWaitThatKeepsFailingEndsTheDrain) {
  if (!uring()) GTEST_SKIP() << "pread/pwrite complete inside Submit";
  const std::string path = JoinPath(dir_.path(), "unreaped");
  AlignedBuffer buffer = AlignedBuffer::Allocate(2 * 4096).value();
  Fill(buffer, 23);
  auto file = Open(path, OpenMode::kCreate);
  ASSERT_TRUE(SetFailpoints("io.uring_wait#1=EBUSY;io.uring_wait#2=EBUSY").ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), 4096}, 1).ok());
  ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 4096, buffer.data() + 4096, 4096}, 2).ok());
  EXPECT_TRUE(engine_->Drain().ok()) << "a busy ring failed the writes";
  EXPECT_EQ(engine_->in_flight(), 0u);
  ASSERT_TRUE(SetFailpoints("").ok());

  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SetFailpoints("io.uring_wait=EIO").IgnoreError();
        engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, buffer.data(), 4096}, 3).IgnoreError();
        engine_->Drain().IgnoreError();
      },
      "1 operation\\(s\\) in flight can no longer be waited for \\(IoError: io_uring_wait_cqe \\[injected at "
      "failpoint io.uring_wait\\]");
}

// io_uring_submit fails after the request was prepared in the ring. The request must not go to
// the kernel later with the next submit, writing stale bytes and completing under the index of
// the slot's next operation.
TEST_P(IoEngineConformance, AFailedSubmitLeavesNoRequestBehind) {
  if (!uring()) GTEST_SKIP() << "pread/pwrite have no submission ring";
  const std::string path = JoinPath(dir_.path(), "unsent");
  AlignedBuffer first = AlignedBuffer::Allocate(4096).value();
  AlignedBuffer second = AlignedBuffer::Allocate(4096).value();
  Fill(first, 17);
  Fill(second, 19);
  {
    auto file = Open(path, OpenMode::kCreate);
    ASSERT_TRUE(SetFailpoints("io.uring_submit#1=EAGAIN").ok());
    Status failed = engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, first.data(), 4096}, 1);
    EXPECT_EQ(failed.code(), Code::kIoError);
    EXPECT_THAT(failed.message(), HasSubstr("io_uring_submit: write " + path + " at offset 0"));
    EXPECT_EQ(engine_->in_flight(), 0u);
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 4096, second.data(), 4096}, 2).ok());
    EXPECT_EQ(engine_->Reap().value(), 2u);
    EXPECT_EQ(engine_->in_flight(), 0u);
    ASSERT_TRUE(engine_->Sync(file.get()).ok());
  }
  std::string bytes = ReadFileLimited(path, 1 << 20).value();
  ASSERT_EQ(bytes.size(), 8192u);
  EXPECT_EQ(bytes.substr(0, 4096), std::string(4096, '\0')) << "the failed write reached the file";
  EXPECT_EQ(std::memcmp(bytes.data() + 4096, second.data(), 4096), 0);
}

// Lengths of 4 GiB and more: an SQE holds 32 bits of length, so each request goes in pieces of
// kMaxTransferBytes. /dev/null takes the bytes without reading them, and a read-only anonymous
// mapping is the zero page, so this costs neither memory nor disk.
TEST_P(IoEngineConformance, RequestsOf4GiBAndMoreAreNotTruncated) {
  const size_t kFour = size_t{4} << 30, kMore = kFour + 4096;
  void* region = ::mmap(nullptr, kMore, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  {
    auto file = engine_->Open("/dev/null", OpenMode::kCreate).value();
    const uint64_t before = Transfers(ProcessIoUsage());
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, region, kFour}, 1).ok());
    ASSERT_TRUE(engine_->Submit(file.get(), IoOp{IoKind::kWrite, 0, region, kMore}, 2).ok());
    std::set<uint64_t> done;
    std::vector<Status> failures;
    ReapAll(engine_.get(), &done, &failures);
    EXPECT_TRUE(failures.empty()) << failures[0].ToString();
    EXPECT_EQ(done, (std::set<uint64_t>{1, 2}));
    const uint64_t pieces = kFour / kMaxTransferBytes + kMore / kMaxTransferBytes + 1;
    if (!std::get<2>(GetParam())) {
      EXPECT_EQ(Transfers(ProcessIoUsage()) - before, pieces);
    }
  }
  ::munmap(region, kMore);
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

// Where io_uring works, the engine every save and load uses is io_uring, not the fallback.
TEST(CreateIoEngine, PicksIoUringWhereItWorks) {
  std::string why;
  if (!UringAvailable(&why)) GTEST_SKIP() << why;
  EXPECT_STREQ(CreateIoEngine()->name(), "io_uring");
}

// The library's one pread/pwrite loop (io/fs.h), used outside the engines: every transfer cut
// short resumes where it stopped; a read past the end names the file and where the data stopped.
TEST(FullyAt, ShortTransfersResumeAndEndOfFileIsDataLossNamingTheOffset) {
  testing::TempDir dir;
  const std::string path = JoinPath(dir.path(), "f");
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::string out(10000, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7);
  int transfers = 0;
  auto halve = [&](size_t* moved) {
    transfers++;
    if (*moved > 1) *moved /= 2;
    return Status::Ok();
  };
  ASSERT_TRUE(TransferFullyAt(true, fd, out.data(), out.size(), 100, path, halve).ok());
  EXPECT_GT(transfers, 10) << "every transfer halved: many calls to write 10000 bytes";
  std::string in(out.size(), '\0');
  ASSERT_TRUE(ReadFullyAt(fd, in.data(), in.size(), 100, path).ok());
  EXPECT_EQ(in, out);
  Status past = ReadFullyAt(fd, in.data(), in.size(), 5000, path);
  EXPECT_EQ(past.code(), Code::kDataLoss);
  EXPECT_THAT(past.message(), HasSubstr("read " + path + ": unexpected end of file at offset 10100"));
  Status failing = TransferFullyAt(false, fd, in.data(), 10, 0, path, [](size_t*) { return DataLoss("hook"); });
  EXPECT_EQ(failing.message(), "hook");
  ::close(fd);
  Status closed = WriteFullyAt(fd, out.data(), 10, 0, path);
  EXPECT_FALSE(closed.ok());
  EXPECT_THAT(closed.message(), HasSubstr("write " + path + " at offset 0 length 10"));
}

// The aligned sequential writer and the read ring (both engines): staged bytes of odd sizes,
// in-place writes, the tail cut to the exact size; read back through the ring in order.
TEST(SequentialWriterAndReadRing, WriteStagedAndInPlaceThenReadBack) {
  for (bool uring : {false, true}) {
    SCOPED_TRACE(uring ? "io_uring" : "posix");
    testing::TempDir dir;
    const std::string path = JoinPath(dir.path(), "seq");
    IoOptions options;
    options.use_io_uring = uring;
    options.queue_depth = 3;
    std::unique_ptr<IoEngine> io = CreateIoEngine(options);
    auto pool = BufferPool::Create(3, 16384).value();
    std::string expected;
    std::vector<size_t> seen;
    {
      SequentialWriter writer(io.get(), pool.get(), [&](size_t buffer, const unsigned char*, size_t length) {
        seen.push_back(length);
        EXPECT_LT(buffer, 3u);
        return Status::Ok();
      });
      ASSERT_TRUE(writer.Open(path).ok());
      std::string staged(50000, '\0');
      for (size_t i = 0; i < staged.size(); ++i) staged[i] = static_cast<char>(i * 13 + 1);
      ASSERT_TRUE(writer.Stage(staged.data(), staged.size()).ok());
      expected = staged;
      ASSERT_TRUE(writer.FlushStaged().ok());
      EXPECT_EQ(writer.position(), AlignUp(50000, kBlockSize));
      expected.resize(writer.position(), '\0');
      AlignedBuffer in_place = AlignedBuffer::Allocate(8192).value();
      std::memset(in_place.data(), 0x5a, 8192);
      ASSERT_TRUE(writer.WriteInPlace(in_place.data(), writer.position(), 8192).ok());
      writer.Reserve(8192);
      expected += std::string(8192, '\x5a');
      ASSERT_TRUE(writer.Stage("tail", 4).ok());
      expected += "tail";
      ASSERT_TRUE(writer.Finish(expected.size()).ok());
    }
    EXPECT_EQ(seen, (std::vector<size_t>{16384, 16384, 16384, 4096, 4096}));
    EXPECT_EQ(ReadFileLimited(path, 1 << 20).value(), expected);
    auto file = io->Open(path, OpenMode::kRead).value();
    std::string back(4 * 16384, '\0');
    std::vector<size_t> order;
    ReadRing ring(io.get(), pool.get(), [&](size_t request, const unsigned char* data) {
      order.push_back(request);
      std::memcpy(&back[request * 16384], data, 16384);
      return Status::Ok();
    });
    // 61444 bytes: the fourth read of 16384 runs past the end and fails; the first three land.
    for (size_t r = 0; r < 4; ++r) ASSERT_TRUE(ring.Read(file.get(), r * 16384, 16384, r).ok());
    Status finished = ring.Finish();
    EXPECT_FALSE(finished.ok()) << "the last read runs past the cut end";
    EXPECT_EQ(back.substr(0, 16384 * 3), expected.substr(0, 16384 * 3));
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
  }
}

TEST(Failpoints, RejectUnknownActions) {
  EXPECT_FALSE(SetFailpoints("x=EWHATEVER").ok());
  EXPECT_FALSE(SetFailpoints("novalue").ok());
  EXPECT_TRUE(SetFailpoints("").ok());
}

}  // namespace
}  // namespace shardckpt
