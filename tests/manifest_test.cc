#include "shardckpt/engine/model/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

namespace shardckpt {
namespace {

using ::testing::HasSubstr;

Manifest Sample() {
  Manifest m;
  m.step = 42;
  m.world_size = 2;
  m.created.time = "2026-11-29T00:00:00Z";
  m.created.user["run"] = "demo";
  // Two files with 3 and 1 data blocks; each table is one page.
  m.files.push_back(FileRecord{"rank-00000.bin", 3 * 4096 + 4096, 3 * 4096, {0x1234}});
  m.files.push_back(FileRecord{"rank-00001.bin", 4096 + 4096, 4096, {0xabcd}});
  EntryRecord w{"model.w", DType::kFloat32, {4, 8}, {}};
  w.chunks.push_back(ChunkRecord{0, 0, 64, Layout::FlatRange(0, 16)});
  w.chunks.push_back(ChunkRecord{1, 0, 64, Layout::FlatRange(16, 32)});
  m.entries.push_back(w);
  EntryRecord b{"model.b", DType::kBFloat16, {2, 3}, {}};
  b.chunks.push_back(ChunkRecord{0, 4096, 12, Layout::Whole()});
  m.entries.push_back(b);
  EntryRecord s{"step", DType::kInt64, {}, {}};
  s.chunks.push_back(ChunkRecord{0, 8192, 8, Layout::Whole()});
  m.entries.push_back(s);
  m.blobs.push_back(BlobRecord{"rng", BlobScope::kPerRank, 1, 1, 2048 * 2, 0});
  return m;
}

TEST(Manifest, RoundTrips) {
  Manifest m = Sample();
  m.blobs[0].offset = 0;
  Result<std::string> json = EncodeManifest(m);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  Result<Manifest> back = DecodeManifest(*json, "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->world_size, 2);
  EXPECT_EQ(back->created.user.at("run"), "demo");
  ASSERT_EQ(back->entries.size(), 3u);
  EXPECT_EQ(back->entries[0].chunks[1].layout, Layout::FlatRange(16, 32));
  // Whole is stored as the full box.
  EXPECT_EQ(back->entries[1].chunks[0].layout, Layout::Box({0, 0}, {2, 3}));
  EXPECT_EQ(back->entries[2].shape, Shape{});
  EXPECT_EQ(back->files[1].table_page_sums[0], 0xabcdu);
  EXPECT_EQ(back->blobs[0].scope, BlobScope::kPerRank);
  EXPECT_EQ(back->blobs[0].rank, 1);
  // What other ranks parse from rank 0's broadcast is the same manifest.
  Result<Manifest> parsed = DecodeValidatedManifest(*json, "broadcast");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*EncodeManifest(*parsed), *json);
}

TEST(Manifest, AcceptsUnknownFields) {
  Manifest m = Sample();
  m.blobs[0].offset = 0;
  std::string json = *CheckSeal(*EncodeManifest(m), "test");
  json.insert(json.find('{') + 1, "\"future_field\": {\"x\": 1},");
  Result<Manifest> decoded = DecodeManifest(SealManifestText(json), "test");
  EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
}

TEST(Manifest, AnyFlippedByteIsDetected) {
  Manifest m = Sample();
  m.blobs[0].offset = 0;
  const std::string json = *EncodeManifest(m);
  // Every byte position, metadata and whitespace included: a flip is never accepted.
  for (size_t at = 0; at < json.size(); at += 7) {
    std::string damaged = json;
    damaged[at] ^= 0x04;
    Result<Manifest> decoded = DecodeManifest(damaged, "m.json");
    ASSERT_FALSE(decoded.ok()) << "flip at " << at << " accepted";
    EXPECT_THAT(decoded.status().message(), HasSubstr("m.json")) << at;
  }
  Result<Manifest> sealed = DecodeManifest(json, "m.json");
  EXPECT_TRUE(sealed.ok());
}

struct Rejected {
  const char* what;
  std::function<void(Manifest&)> damage;
  const char* message;
};

TEST(Manifest, RejectsHostileOrBrokenManifests) {
  const std::vector<Rejected> cases = {
      {"slash in a file name", [](Manifest& m) { m.files[0].name = "../../etc/passwd"; }, "not a plain file name"},
      {"dot-dot file name", [](Manifest& m) { m.files[1].name = ".."; }, "not a plain file name"},
      {"absolute file name", [](Manifest& m) { m.files[1].name = "/tmp/x"; }, "not a plain file name"},
      {"chunk past the data", [](Manifest& m) { m.entries[0].chunks[1].offset = 4096; }, "runs past the data"},
      {"offset overflow", [](Manifest& m) { m.entries[2].chunks[0].offset = ~uint64_t{0} - 4095; }, "runs past"},
      {"bytes disagree with layout", [](Manifest& m) { m.entries[0].chunks[0].bytes = 60; }, "layout needs 64"},
      {"shape overflow", [](Manifest& m) { m.entries[0].shape = {int64_t{1} << 40, int64_t{1} << 40}; }, "too large"},
      {"negative dim", [](Manifest& m) { m.entries[0].shape = {-4, 8}; }, "negative dim"},
      {"gap in coverage",
       [](Manifest& m) {
         m.entries[0].chunks[1].layout = Layout::FlatRange(20, 32);
         m.entries[0].chunks[1].bytes = 48;
       },
       "cover 28 of 32"},
      {"overlapping chunks",
       [](Manifest& m) {
         m.entries[0].chunks[1].layout = Layout::FlatRange(8, 24);
       },
       "overlaps"},
      {"file index out of range", [](Manifest& m) { m.entries[0].chunks[0].file = 7; }, "out of range"},
      {"duplicate entry", [](Manifest& m) { m.entries[1].name = "model.w"; }, "listed twice"},
      {"file size inconsistent", [](Manifest& m) { m.files[0].size = 100; }, "does not match"},
      {"table sums missing", [](Manifest& m) { m.files[0].table_page_sums.clear(); }, "table checksums"},
      {"blob of a rank outside the world", [](Manifest& m) { m.blobs[0].rank = 5; }, "world of 2"},
  };
  for (const Rejected& c : cases) {
    Manifest m = Sample();
    m.blobs[0].offset = 0;
    c.damage(m);
    Result<std::string> json = EncodeManifest(m);
    ASSERT_TRUE(json.ok()) << c.what;
    Result<Manifest> decoded = DecodeManifest(*json, "ckpt/manifest.json");
    ASSERT_FALSE(decoded.ok()) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr("ckpt/manifest.json")) << c.what;
  }
}

TEST(Manifest, RejectsMalformedJsonAndVersions) {
  std::string good = *EncodeManifest([] {
    Manifest m = Sample();
    m.blobs[0].offset = 0;
    return m;
  }());
  struct Text {
    std::string json;
    const char* message;
  };
  std::string future = good;
  future = *CheckSeal(future, "x");
  size_t version = future.find_first_of("1", future.find("\"format_version\""));
  future[version] = '2';  // major version 2
  future = SealManifestText(future);
  std::vector<Text> cases = {
      {"", "malformed"},
      {"[]", "not a shardckpt manifest"},
      {"{\"format\": \"other\"}", "not a shardckpt manifest"},
      {good.substr(0, good.size() / 2), "malformed"},
      {future, "format version 2.0 is not supported"},
  };
  for (const Text& c : cases) {
    Result<Manifest> decoded = DecodeManifest(c.json, "m.json");
    ASSERT_FALSE(decoded.ok()) << c.json.substr(0, 40);
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.message)) << c.json.substr(0, 40);
  }
}

TEST(Manifest, CheckDataFilesNamesMissingAndTruncatedFiles) {
  Manifest m = Sample();
  auto sizes = [](uint64_t first, bool second_missing) {
    return [=](const std::string& name) -> Result<uint64_t> {
      if (name == "rank-00000.bin") return first;
      if (second_missing) return NotFound("stat " + name + ": No such file");
      return uint64_t{8192};
    };
  };
  EXPECT_TRUE(CheckDataFiles(m, sizes(16384, false)).ok());
  Status truncated = CheckDataFiles(m, sizes(9000, false));
  EXPECT_EQ(truncated.code(), Code::kDataLoss);
  EXPECT_THAT(truncated.message(), HasSubstr("'rank-00000.bin' is 9000 bytes"));
  EXPECT_THAT(truncated.message(), HasSubstr("truncated"));
  Status missing = CheckDataFiles(m, sizes(16384, true));
  EXPECT_EQ(missing.code(), Code::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'rank-00001.bin' is missing"));
}

}  // namespace
}  // namespace shardckpt
