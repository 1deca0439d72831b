// Whole-file helpers (io/fs.h): the commit's manifest written with O_DIRECT through kept staging
// (WriteFileDurably) and read back the same way (ReadFileLimited with prefer_direct).
#include "shardckpt/io/fs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/direct_io.h"
#include "shardckpt/io/failpoint.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

TEST(PathText, TrailingSlashesAreDroppedButTheRootStays) {
  const std::pair<const char*, const char*> cases[] = {
      {"a/b/", "a/b"}, {"a/b//", "a/b"}, {"a/b", "a/b"}, {"/", "/"}, {"//", "/"}, {"", ""}, {"step-000000009/", "step-000000009"},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(WithoutTrailingSlashes(in), out) << in;
}

std::string Pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return s;
}

uint64_t SizeOf(const std::string& path) { return FileSize(path).value(); }

// Pages of `path` in the page cache: none for a file written with O_DIRECT.
size_t CachedPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SIZE_MAX;
  const size_t size = SizeOf(path);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return SIZE_MAX;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  const int rc = ::mincore(map, size, resident.data());
  ::munmap(map, size);
  if (rc != 0) return SIZE_MAX;
  size_t cached = 0;
  for (unsigned char r : resident) cached += r & 1;
  return cached;
}

class WholeFile : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(SetFailpoints("").ok()); }
  std::string Path(const std::string& name) const { return JoinPath(dir_.path(), name); }
  testing::TempDir dir_;
};

TEST_F(WholeFile, EverySizeRoundTripsExactlyWithAndWithoutODirect) {
  AlignedBuffer staging;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{3u << 20} + 17}) {
    SCOPED_TRACE(size);
    const std::string bytes = Pattern(size, static_cast<unsigned>(size));
    const std::string path = Path("m" + std::to_string(size));
    ASSERT_TRUE(WriteFileDurably(path, {bytes}, &staging, "t").ok());
    EXPECT_EQ(SizeOf(path), size);  // the padding of the last block is cut off
    EXPECT_EQ(ReadFileLimited(path, size, /*prefer_direct=*/true).value(), bytes);
    EXPECT_EQ(ReadFileLimited(path, size, /*prefer_direct=*/false).value(), bytes);
  }
  // In memory-backed folders too (no O_DIRECT there): the same bytes.
  const std::string shm = "/dev/shm/shardckpt-fs-test-" + std::to_string(::getpid());
  if (IsDirectory("/dev/shm") && MakeDir(shm).ok()) {
    const std::string bytes = Pattern(10000, 3);
    const std::string path = JoinPath(shm, "m");
    Status wrote = WriteFileDurably(path, {bytes}, &staging, "t");
    Result<std::string> read = ReadFileLimited(path, 10000, true);
    ASSERT_TRUE(RemoveTree(shm).ok());
    ASSERT_TRUE(wrote.ok()) << wrote.ToString();
    EXPECT_EQ(read.value(), bytes);
  }
}

// A repeat save's manifest is a new head, its kept body and a new seal, written as they stand.
TEST_F(WholeFile, PiecesAreWrittenOneAfterTheOther) {
  AlignedBuffer staging;
  const std::string head = Pattern(5000, 1), body = Pattern(3 << 20, 2), seal = Pattern(27, 3);
  std::vector<std::string> dirs = {dir_.path()};
  const std::string shm = "/dev/shm/shardckpt-fs-test-pieces-" + std::to_string(::getpid());
  if (IsDirectory("/dev/shm") && MakeDir(shm).ok()) dirs.push_back(shm);  // no O_DIRECT there
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    const std::string path = JoinPath(dir, "m");
    // An empty piece may be a default view, whose data() is null (a manifest without a kept body).
    ASSERT_TRUE(WriteFileDurably(path, {head, std::string_view(), "", body, seal}, &staging, "t").ok());
    EXPECT_EQ(ReadFileLimited(path, 8 << 20, true).value(), head + body + seal);
    ASSERT_TRUE(WriteFileDurably(path, {"", ""}, &staging, "t").ok());
    EXPECT_EQ(SizeOf(path), 0u);
    // No kept staging: the call stages in memory of its own.
    ASSERT_TRUE(WriteFileDurably(path, {seal, head}, nullptr, "t").ok());
    EXPECT_EQ(ReadFileLimited(path, 8 << 20, true).value(), seal + head);
  }
  if (dirs.size() > 1) {
    ASSERT_TRUE(RemoveTree(shm).ok());
  }
}

TEST_F(WholeFile, AShorterWriteReplacesALongerFileWhole) {
  AlignedBuffer staging;
  const std::string path = Path("m");
  ASSERT_TRUE(WriteFileDurably(path, {Pattern(20000, 1)}, &staging, "t").ok());
  const std::string shorter = Pattern(5000, 2);
  ASSERT_TRUE(WriteFileDurably(path, {shorter}, &staging, "t").ok());
  EXPECT_EQ(SizeOf(path), 5000u);
  EXPECT_EQ(ReadFileLimited(path, 1 << 20, true).value(), shorter);
}

TEST_F(WholeFile, KeptStagingIsReusedAndGrownOnlyWhenTooSmall) {
  AlignedBuffer staging;
  const uint64_t before = HostBufferAllocations();
  ASSERT_TRUE(WriteFileDurably(Path("a"), {Pattern(1 << 20, 1)}, &staging, "t").ok());
  std::string why;
  if (!testing::DirectIoAvailable(dir_.path(), &why) || IsMemoryBacked(Path("a"))) {
    GTEST_SKIP() << "no O_DIRECT in " << dir_.path() << " (" << why << "): nothing is staged";
  }
  EXPECT_EQ(HostBufferAllocations() - before, 1u);
  // A manifest a little larger next time (its time, its metrics) fits the slack.
  ASSERT_TRUE(WriteFileDurably(Path("b"), {Pattern((1 << 20) + 5000, 2)}, &staging, "t").ok());
  ASSERT_TRUE(WriteFileDurably(Path("c"), {Pattern(100, 3)}, &staging, "t").ok());
  EXPECT_EQ(HostBufferAllocations() - before, 1u) << "the kept staging was not reused";
  ASSERT_TRUE(WriteFileDurably(Path("d"), {Pattern(2 << 20, 4)}, &staging, "t").ok());
  EXPECT_EQ(HostBufferAllocations() - before, 2u);
  EXPECT_GE(staging.size(), size_t{2} << 20);
  EXPECT_EQ(ReadFileLimited(Path("b"), 4 << 20, true).value(), Pattern((1 << 20) + 5000, 2));
  EXPECT_EQ(ReadFileLimited(Path("d"), 4 << 20, true).value(), Pattern(2 << 20, 4));
}

TEST_F(WholeFile, ADurableWriteLeavesNothingInThePageCache) {
  std::string why;
  if (!testing::DirectIoAvailable(dir_.path(), &why) || IsMemoryBacked(Path("m"))) {
    GTEST_SKIP() << "no O_DIRECT in " << dir_.path() << " (" << why << ")";
  }
  AlignedBuffer staging;
  const std::string path = Path("m");
  ASSERT_TRUE(WriteFileDurably(path, {Pattern(300000, 5)}, &staging, "t").ok());
  EXPECT_EQ(CachedPages(path), 0u) << "the manifest went through the page cache";
  ASSERT_TRUE(WriteFileAtomic(Path("buffered"), Pattern(300000, 5), "t").ok());
  EXPECT_GT(CachedPages(Path("buffered")), 0u) << "the probe cannot see cached pages";
}

// WriteFileAtomic writes a fresh temp file: a symlink planted at PATH.tmp made a save write
// `latest` into the link's target, outside the root. A stale temp file is replaced; a folder in
// its place is named.
TEST_F(WholeFile, AnAtomicWriteNeverFollowsWhatItFindsAtItsTempName) {
  const std::string victim = Path("victim.txt"), latest = Path("latest");
  ASSERT_TRUE(WriteFileAtomic(victim, "precious", "t").ok());
  ASSERT_EQ(::symlink(victim.c_str(), (latest + ".tmp").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(latest, "step-000000006\n", "t").ok());
  EXPECT_EQ(ReadFileLimited(victim, 100).value(), "precious");
  struct stat st {};
  ASSERT_EQ(::lstat(latest.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "latest is not a plain file";
  EXPECT_EQ(ReadFileLimited(latest, 100).value(), "step-000000006\n");
  EXPECT_FALSE(PathExists(latest + ".tmp"));
  ASSERT_TRUE(WriteFileAtomic(latest + ".tmp", "stale", "t").ok());  // a writer that died
  ASSERT_TRUE(WriteFileAtomic(latest, "step-000000007\n", "t").ok());
  EXPECT_EQ(ReadFileLimited(latest, 100).value(), "step-000000007\n");
  ASSERT_TRUE(MakeDir(latest + ".tmp").ok());
  Status blocked = WriteFileAtomic(latest, "step-000000008\n", "t");
  EXPECT_EQ(blocked.code(), Code::kFailedPrecondition);
  EXPECT_THAT(blocked.message(), HasSubstr(latest + ".tmp is a folder"));
  EXPECT_EQ(ReadFileLimited(latest, 100).value(), "step-000000007\n");
}

TEST_F(WholeFile, FailpointsNameTheStepAndTheFile) {
  AlignedBuffer staging;
  ASSERT_TRUE(SetFailpoints("commit.manifest.write=EIO").ok());
  Status failed = WriteFileDurably(Path("m"), {"abc"}, &staging, "commit.manifest");
  EXPECT_EQ(failed.code(), Code::kIoError);
  EXPECT_THAT(failed.ToString(), HasSubstr("failpoint commit.manifest.write"));
  EXPECT_THAT(failed.ToString(), HasSubstr(Path("m")));
  EXPECT_FALSE(PathExists(Path("m")));
  ASSERT_TRUE(SetFailpoints("commit.manifest.fsync=ENOSPC").ok());
  failed = WriteFileDurably(Path("m"), {"abc"}, &staging, "commit.manifest");
  EXPECT_EQ(failed.code(), Code::kNoSpace);
  EXPECT_THAT(failed.ToString(), HasSubstr("failpoint commit.manifest.fsync"));
}

TEST_F(WholeFile, AReadRefusesAFileOverItsLimitAndNamesAMissingOne) {
  AlignedBuffer staging;
  ASSERT_TRUE(WriteFileDurably(Path("m"), {Pattern(8193, 1)}, &staging, "t").ok());
  Result<std::string> big = ReadFileLimited(Path("m"), 8192, true);
  EXPECT_EQ(big.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(big.status().ToString(), HasSubstr("8193 bytes, over the limit of 8192"));
  Result<std::string> missing = ReadFileLimited(Path("none"), 8192, true);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_THAT(missing.status().ToString(), HasSubstr(Path("none")));
}

TEST_F(WholeFile, AWriteIntoAMissingFolderFailsWithTheFileNamed) {
  AlignedBuffer staging;
  Status failed = WriteFileDurably(Path("no-such-folder/m"), {"abc"}, &staging, "t");
  EXPECT_EQ(failed.code(), Code::kNotFound);
  EXPECT_THAT(failed.ToString(), HasSubstr(Path("no-such-folder/m")));
}

// A FIFO where a file should be blocked open() for good (inspect, verify and list hung on a
// manifest.json that was one): every open the library makes refuses it at once, by name, as it
// does a directory. alarm() turns a hang into a failure.
TEST_F(WholeFile, AFifoOrFolderIsRefusedWithoutWaiting) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0);
  ASSERT_TRUE(MakeDir(Path("folder")).ok());
  ::alarm(60);
  for (const char* name : {"fifo", "folder"}) {
    for (bool direct : {false, true}) {
      Result<std::string> read = ReadFileLimited(Path(name), 1 << 20, direct);
      EXPECT_EQ(read.status().code(), Code::kFailedPrecondition) << name;
      EXPECT_THAT(read.status().ToString(), HasSubstr(Path(name) + " is not a regular file"));
    }
  }
  EXPECT_THAT(ReadFileLimited(Path("fifo"), 1 << 20).status().ToString(), HasSubstr("(a FIFO)"));
  Result<int> write = OpenFileNotFifo(Path("fifo"), O_WRONLY | O_CREAT | O_TRUNC);
  EXPECT_EQ(write.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(write.status().ToString(), HasSubstr(Path("fifo") + " is not a regular file (a FIFO)"));
  // A socket fails open() with ENXIO, as a FIFO without a reader does: named as what it is.
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  struct sockaddr_un address {};
  address.sun_family = AF_UNIX;
  const std::string socket_path = Path("sock");
  ASSERT_LT(socket_path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_THAT(ReadFileLimited(socket_path, 1 << 20).status().ToString(), HasSubstr(socket_path + " is not a regular file (a socket)"));
  ::close(sock);
  ::alarm(0);
  // A regular file opens blocking as usual: O_NONBLOCK was only for the open itself.
  Result<int> file = OpenFileNotFifo(Path("plain"), O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(::fcntl(*file, F_GETFL) & O_NONBLOCK, 0);
  ::close(*file);
}

}  // namespace
}  // namespace shardckpt

namespace shardckpt {
namespace {

// The folders made for an output that then fails go again; those that were there, or that
// hold something, stay.
TEST(MadeDirs, RemovesWhatItMadeUnlessKept) {
  testing::TempDir dir;
  const std::string base = JoinPath(dir.path(), "out");
  {
    MadeDirs made(JoinPath(base, "a/b"));
    ASSERT_TRUE(made.status().ok()) << made.status().ToString();
    EXPECT_TRUE(IsDirectory(JoinPath(base, "a/b")));
  }
  EXPECT_FALSE(PathExists(base));
  {
    MadeDirs made(JoinPath(base, "a/b"));
    ASSERT_TRUE(WriteFileAtomic(JoinPath(base, "a/keep.txt"), "x", "test").ok());
  }
  EXPECT_FALSE(PathExists(JoinPath(base, "a/b")));
  EXPECT_TRUE(PathExists(JoinPath(base, "a/keep.txt")));  // not empty: it and above stay
  {
    MadeDirs made(JoinPath(base, "c"));
    made.Keep();
  }
  EXPECT_TRUE(IsDirectory(JoinPath(base, "c")));
  {
    MadeDirs dotted(JoinPath(base, "x/./y/../z"));  // made as x/z; both go again
    ASSERT_TRUE(dotted.status().ok());
  }
  EXPECT_FALSE(PathExists(JoinPath(base, "x")));
  MadeDirs file_in_the_way(JoinPath(base, "a/keep.txt/d"));
  EXPECT_FALSE(file_in_the_way.status().ok());
}

}  // namespace
}  // namespace shardckpt
