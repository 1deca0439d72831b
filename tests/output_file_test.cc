// OutputFile: the exported file's bytes and its SHA-256, hashed on a helper thread buffer by
// buffer, must be those of every byte written, in order, whatever the sizes of the writes and
// however many times the staging ring goes round.
#include "shardckpt/engine/formats/output_file.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using testing::TempDir;

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < length; ++i) {
    static const char* kHex = "0123456789abcdef";
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

// Writes `data` through an OutputFile in pieces of the given sizes (cycled), then closes it.
std::string WriteInPieces(const std::string& path, const std::string& data, const std::vector<size_t>& pieces) {
  std::unique_ptr<OutputFile> out = OutputFile::Create(path).value();
  size_t at = 0;
  for (size_t i = 0; at < data.size(); ++i) {
    const size_t n = std::min(pieces[i % pieces.size()], data.size() - at);
    EXPECT_TRUE(out->Write(data.data() + at, n).ok());
    at += n;
  }
  EXPECT_EQ(out->position(), data.size());
  Status closed = out->Close();
  EXPECT_TRUE(closed.ok()) << closed.ToString();
  return out->sha256();
}

TEST(OutputFileTest, BytesAndSha256AreThoseWrittenAcrossManyRoundsOfTheRing) {
  TempDir dir;
  // 41 MiB and 4099 bytes: the 4 MiB buffers go round the ring of eight more than once, and the
  // last block is partial (padded on disk, cut off, not hashed).
  std::string data((41u << 20) + 4099, '\0');
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(data.data() + i, &v, 8);
  }
  const std::string path = JoinPath(dir.path(), "out.pt");
  const std::string sha = WriteInPieces(path, data, {1, 3u << 20, 4096, 77, 5u << 20, 4095});
  const std::string expected = Sha256Hex(data);
  EXPECT_EQ(sha, expected);
  EXPECT_EQ(ReadFileLimited(path, data.size() + 1).value(), data);
  EXPECT_EQ(ReadFileLimited(path + ".sha256", 1000).value(), expected + "  out.pt\n");
  EXPECT_FALSE(PathExists(path + ".partial"));
}

TEST(OutputFileTest, AnEmptyFileHasTheEmptyDigest) {
  TempDir dir;
  const std::string path = JoinPath(dir.path(), "empty.safetensors");
  EXPECT_EQ(WriteInPieces(path, "", {1}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ReadFileLimited(path, 10).value(), "");
}

TEST(OutputFileTest, AnAbandonedExportLeavesNothing) {
  TempDir dir;
  const std::string path = JoinPath(dir.path(), "half.pt");
  {
    std::unique_ptr<OutputFile> out = OutputFile::Create(path).value();
    std::string data(9u << 20, 'x');  // two buffers submitted and hashing when it is dropped
    ASSERT_TRUE(out->Write(data.data(), data.size()).ok());
  }
  EXPECT_FALSE(PathExists(path));
  EXPECT_FALSE(PathExists(path + ".partial"));
  EXPECT_FALSE(PathExists(path + ".sha256"));
}

// Staging in proportion to the file: a small export faults in little fresh memory, a large one
// keeps eight 4 MiB writes in flight; unknown sizes get eight.
TEST(OutputFileTest, StagingGrowsWithTheFile) {
  const std::vector<std::pair<uint64_t, size_t>> table = {
      {0, 8}, {1, 2}, {56u << 20, 2}, {96u << 20, 3}, {128u << 20, 4}, {255u << 20, 7}, {256u << 20, 8}, {64ull << 30, 8}};
  for (const auto& [bytes, buffers] : table) EXPECT_EQ(OutputFile::BuffersFor(bytes), buffers) << bytes;
  // A file written through the fewest buffers still comes out whole.
  testing::TempDir dir;
  const std::string path = JoinPath(dir.path(), "small.bin");
  std::string data(9u << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 12));
  auto out = OutputFile::Create(path, 1).value();
  for (size_t at = 0; at < data.size(); at += 1000003) ASSERT_TRUE(out->Write(data.data() + at, std::min<size_t>(1000003, data.size() - at)).ok());
  ASSERT_TRUE(out->Close().ok());
  EXPECT_EQ(ReadFileLimited(path, 64u << 20).value(), data);
}

}  // namespace
}  // namespace shardckpt
