// ManifestAhead (engine/core/manifest_ahead.h): the body written early, then the head and the
// seal; the file must hold exactly the joined text, on a disk (O_DIRECT) and on tmpfs.
#include "shardckpt/engine/core/manifest_ahead.h"

#include <gtest/gtest.h>

#include <iostream>

#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "test_util.h"

namespace shardckpt {
namespace {

std::string Repeated(const std::string& unit, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += unit;
  out.resize(bytes);
  return out;
}

struct Folder {
  const char* name;
  std::string path;
  bool expect_direct;
};

class ManifestAheadTest : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  testing::TempDir disk_;
};

TEST_F(ManifestAheadTest, TheFileHoldsHeadBodyAndSealExactly) {
  // The O_DIRECT path needs a disk: where $TMPDIR is not one, only the buffered path runs here
  // (and says so), as on tmpfs.
  std::string why;
  const bool direct = testing::FastPathAvailable(disk_.path(), &why);
  if (!direct) std::cerr << "[ NOTE     ] no O_DIRECT in " << disk_.path() << " (" << why << "): buffered only\n";
  std::vector<Folder> folders = {{"disk", disk_.path(), direct}};
  std::unique_ptr<testing::TempDir> shm;
  if (IsDirectory("/dev/shm")) {
    setenv("TMPDIR", "/dev/shm", 1);
    shm = std::make_unique<testing::TempDir>();
    unsetenv("TMPDIR");
    folders.push_back({"tmpfs", shm->path(), false});
  }
  AlignedBuffer staging;  // grown by the first write, reused after
  int n = 0;
  for (const Folder& folder : folders) {
    // Bodies of no whole block, exactly whole blocks, and whole blocks plus a tail.
    for (size_t body_bytes : {size_t{100}, size_t{8192}, size_t{3 * 4096 + 777}}) {
      for (size_t seal_bytes : {size_t{41}, size_t{4096 - 777 + 41}}) {
        const std::string head = Repeated("{head ", 4096);
        const std::string body = Repeated(",body" + std::to_string(n), body_bytes);
        const std::string seal = Repeated("seal}", seal_bytes);
        const std::string path = JoinPath(folder.path, "manifest-" + std::to_string(n++) + ".json");
        ManifestAhead ahead(path, 4096, body, &staging);
        ASSERT_TRUE(ahead.Wait().ok()) << ahead.Wait().ToString();
        if (folder.expect_direct) EXPECT_TRUE(ahead.direct()) << folder.name;
        if (std::string(folder.name) == "tmpfs") EXPECT_FALSE(ahead.direct());
        EXPECT_TRUE(ahead.Fits(head, body));
        EXPECT_FALSE(ahead.Fits(head.substr(1), body));           // a head that outgrew its room
        EXPECT_FALSE(ahead.Fits(head, std::string_view(body).substr(1)));  // another body
        Status done = ahead.Complete(head, body, seal);
        ASSERT_TRUE(done.ok()) << folder.name << ": " << done.ToString();
        Result<std::string> back = ReadFileLimited(path, 1 << 20);
        ASSERT_TRUE(back.ok()) << back.status().ToString();
        EXPECT_EQ(*back, head + body + seal) << folder.name << " body " << body_bytes << " seal " << seal_bytes;
      }
    }
  }
}

TEST_F(ManifestAheadTest, AFailedEarlyWriteIsItsStatusAndCompletesNothing) {
  ASSERT_TRUE(SetFailpoints("commit.manifest_ahead=EIO").ok());
  const std::string body(10000, 'b');
  AlignedBuffer staging;
  const std::string path = JoinPath(disk_.path(), "manifest.json");
  ManifestAhead ahead(path, 4096, body, &staging);
  Status early = ahead.Wait();
  EXPECT_EQ(early.code(), Code::kIoError);
  EXPECT_NE(early.message().find(path), std::string::npos) << early.message();
  EXPECT_EQ(ahead.Complete(std::string(4096, 'h'), body, "}").code(), Code::kIoError);
  EXPECT_FALSE(PathExists(path));
}

// The file is the save's own: one a dead try left is replaced whole, however long it was.
TEST_F(ManifestAheadTest, ALongerFileThereIsReplacedWhole) {
  const std::string path = JoinPath(disk_.path(), "manifest.json");
  ASSERT_TRUE(WriteFileAtomic(path, std::string(50000, 'x'), "test").ok());
  AlignedBuffer staging;
  const std::string body(5000, 'b');  // outlives the early write, as the kept body does
  const std::string head(4096, 'h');
  ManifestAhead ahead(path, 4096, body, &staging);
  ASSERT_TRUE(ahead.Wait().ok()) << ahead.Wait().ToString();
  ASSERT_TRUE(ahead.Complete(head, body, "}").ok());
  EXPECT_EQ(ReadFileLimited(path, 1 << 20).value(), head + body + "}");
}

}  // namespace
}  // namespace shardckpt
