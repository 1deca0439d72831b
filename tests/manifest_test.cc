#include "shardckpt/engine/model/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>

#include "shardckpt/engine/model/manifest_wire.h"

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

// A repeat save's text with a head room (manifest_ahead.h): the body starts at the room, the
// text ends on a block boundary, and it reads back as the unpadded text does.
TEST(Manifest, AHeadRoomPadsTheHeadAndTheSealWithSpacesOnly) {
  Manifest m = Sample();
  m.blobs[0].offset = 0;
  Result<ManifestBody> body = EncodeManifestBody(m);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  Result<ManifestTextPieces> plain = EncodeManifestWithBody(m, *body);
  Result<ManifestTextPieces> roomy = EncodeManifestWithBody(m, *body, 8192);
  ASSERT_TRUE(plain.ok() && roomy.ok());
  EXPECT_EQ(plain->Joined(), EncodeManifest(m).value());  // no room: the text as ever
  EXPECT_EQ(roomy->head.size(), 8192u);
  EXPECT_EQ(roomy->head.substr(0, plain->head.size()), plain->head);
  EXPECT_EQ(roomy->head.find_first_not_of(' ', plain->head.size()), std::string::npos);
  const std::string text = roomy->Joined();
  EXPECT_EQ(text.size() % 4096, 0u);
  EXPECT_EQ(text.compare(8192, body->text.size(), body->text), 0);
  Result<Manifest> back = DecodeManifest(text, "m.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EncodeManifest(*back).value(), EncodeManifest(m).value());
  std::string flipped = text;
  flipped[8000] = '\t';  // padding is covered by the seal like any other byte
  EXPECT_EQ(DecodeManifest(flipped, "m.json").status().code(), Code::kDataLoss);

  // A head longer than its room is left as it is, and still reads back.
  Result<ManifestTextPieces> tight = EncodeManifestWithBody(m, *body, 64);
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ(tight->head, plain->head);
  EXPECT_TRUE(DecodeManifest(tight->Joined(), "m.json").ok());
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
  // What other ranks of a load read from rank 0's message is the same manifest.
  Result<Manifest> shared = DecodeManifestMessage(EncodeManifestMessage(*back), "message");
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(*EncodeManifest(*shared), *json);
}

// Chunk lists are written in the compact form the fast reader takes (chunk_list_text.h), for
// every layout kind, a 0-d tensor, and boxes of more dims than a chunk's text buffer holds.
TEST(Manifest, ChunkListsAreWrittenCompactForEveryKindAndRank) {
  Manifest m;
  m.files.push_back(FileRecord{"rank-00000.bin", 8192, 4096, {0}});
  auto entry_text = [&](const EntryRecord& e) {
    m.entries = {e};
    const std::string text = EncodeManifest(m).value();
    const size_t at = text.find("\"chunks\": ");
    return text.substr(at + 10, text.find("]}", at) + 1 - at - 10);
  };
  EntryRecord flat{"f", DType::kFloat32, {4, 8}, {}};
  flat.chunks = {ChunkRecord{0, 0, 64, Layout::FlatRange(0, 16)},
                 ChunkRecord{0, 18446744073709551615ull, 64, Layout::FlatRange(16, 32)}};
  EXPECT_EQ(entry_text(flat), "[[0,0,64,0,16],[0,18446744073709551615,64,16,32]]");
  EntryRecord box{"b", DType::kUInt8, {9, 2, 1, 3, 5}, {}};
  box.chunks = {ChunkRecord{7, 4096, 30, Layout::Box({3, 0, 0, 0, 0}, {1, 2, 1, 3, 5})}};
  EXPECT_EQ(entry_text(box), "[[7,4096,30,[3,0,0,0,0],[1,2,1,3,5]]]");
  EntryRecord whole{"w", DType::kInt64, {2, 3}, {}};
  whole.chunks = {ChunkRecord{0, 8192, 48, Layout::Whole()}};
  EXPECT_EQ(entry_text(whole), "[[0,8192,48,[0,0],[2,3]]]");
  EntryRecord scalar{"s", DType::kInt64, {}, {}};
  scalar.chunks = {ChunkRecord{0, 0, 8, Layout::Whole()}};
  EXPECT_EQ(entry_text(scalar), "[[0,0,8,[],[]]]");
  EntryRecord deep{"d", DType::kUInt8, Shape(kMaxDims, 1), {}};
  deep.shape[0] = 1000000007;
  Dims offsets, sizes = deep.shape;
  offsets.resize(kMaxDims, 0);
  offsets[0] = 999999999;
  sizes[0] = 8;
  deep.chunks = {ChunkRecord{4294967295u, 9223372036854775807ull, 8, Layout::Box(offsets, sizes)}};
  std::string expected = "[[4294967295,9223372036854775807,8,[999999999";
  for (int d = 1; d < kMaxDims; ++d) expected += ",0";
  expected += "],[8";
  for (int d = 1; d < kMaxDims; ++d) expected += ",1";
  EXPECT_EQ(entry_text(deep), expected + "]]]");
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
      // Each chunk alone is sound; a load would read chunk 0's values for chunk 1's elements.
      {"two chunks on the same bytes",
       [](Manifest& m) {
         m.entries[0].chunks[1].file = 0;
         m.entries[0].chunks[1].offset = 32;
       },
       "entry 'model.w' chunks 0 and 1 share bytes of file 'rank-00000.bin' (from offset 32)"},
      {"two chunks on the same bytes, out of file order",
       [](Manifest& m) {
         m.entries[0].chunks[0].offset = 32;
         m.entries[0].chunks[1].file = 0;
       },
       "entry 'model.w' chunks 0 and 1 share bytes of file 'rank-00000.bin' (from offset 32)"},
      {"file index out of range", [](Manifest& m) { m.entries[0].chunks[0].file = 7; }, "out of range"},
      {"duplicate entry", [](Manifest& m) { m.entries[1].name = "model.w"; }, "listed twice"},
      {"file size inconsistent", [](Manifest& m) { m.files[0].size = 100; }, "does not match"},
      {"table sums missing", [](Manifest& m) { m.files[0].table_page_sums.clear(); }, "table checksums"},
      {"blob of a rank outside the world", [](Manifest& m) { m.blobs[0].rank = 5; }, "world of 2"},
      {"negative step", [](Manifest& m) { m.step = -4; }, "step -4 is negative"},
      // A NUL cut each message and table naming it short: refused, and shown as "\0".
      {"NUL in an entry's name", [](Manifest& m) { m.entries[1].name = std::string("model.fc3\0bias", 14); },
       "entry 'model.fc3\\0bias' has a NUL byte in its name"},
      {"NUL in a blob's name", [](Manifest& m) { m.blobs[0].name = std::string("rng\0x", 5); },
       "blob 'rng\\0x' has a NUL byte in its name"},
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

// Chunks of one entry in any file order, apart: sound (the bytes check sorts them first).
TEST(Manifest, AcceptsChunksOutOfFileOrderOnBytesApart) {
  Manifest m = Sample();
  std::swap(m.entries[0].chunks[0].file, m.entries[0].chunks[1].file);  // file 1 first, then file 0
  Result<std::string> json = EncodeManifest(m);
  ASSERT_TRUE(json.ok());
  Result<Manifest> decoded = DecodeManifest(*json, "ckpt/manifest.json");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->entries[0].chunks[0].file, 1u);
}

// 1,000 entries of 80 one-element chunks: past the size at which the chunks are checked on two
// threads, the first half's and the second half's entries on different ones.
Manifest ManyChunks() {
  constexpr int kEntries = 1000, kChunks = 80;
  Manifest m;
  const uint64_t data = uint64_t{kEntries} * kChunks * 4;
  const uint64_t table_offset = (data + 4095) / 4096 * 4096;
  m.files.push_back(FileRecord{"rank-00000.bin", DataFileSize(table_offset), table_offset,
                               std::vector<uint64_t>(TablePages(table_offset), 0)});
  uint64_t offset = 0;
  for (int e = 0; e < kEntries; ++e) {
    EntryRecord entry{"layer." + std::to_string(e), DType::kFloat32, {kChunks}, {}};
    for (int c = 0; c < kChunks; ++c, offset += 4) entry.chunks.push_back(ChunkRecord{0, offset, 4, Layout::FlatRange(c, c + 1)});
    m.entries.push_back(std::move(entry));
  }
  return m;
}

// `m`'s body through ManifestBodyBuilder: its entries from `split` on in a second builder
// (entries.size(): one builder), as an offline writer builds a large one on two threads.
Result<ManifestBody> BuildBody(const Manifest& m, size_t split) {
  Manifest head = m;
  head.entries.clear();
  head.blobs.clear();
  ManifestBodyBuilder first(head, split, 0), second(head, m.entries.size() - split, 0, split);
  for (size_t i = 0; i < m.entries.size(); ++i) SC_RETURN_IF_ERROR((i < split ? first : second).Add(m.entries[i]));
  return first.Finish(m.blobs, &second);
}

TEST(Manifest, ValidatingOnTwoThreadsReturnsTheFirstErrorInEntryOrder) {
  auto bad_chunk = [](Manifest& m, int e) { m.entries[static_cast<size_t>(e)].chunks[3].bytes = 8; };
  struct Case {
    const char* what;
    std::function<void(Manifest&)> damage;
    const char* message;  // empty: valid
  };
  const std::vector<Case> cases = {
      {"valid", [](Manifest&) {}, ""},
      {"chunks wrong in both halves",
       [&](Manifest& m) {
         bad_chunk(m, 10);
         bad_chunk(m, 900);
       },
       "entry 'layer.10' chunk 3 holds 8 bytes"},
      {"chunks wrong in the second half", [&](Manifest& m) { bad_chunk(m, 900); }, "entry 'layer.900' chunk 3 holds 8 bytes"},
      {"a name listed twice after a chunk error",
       [&](Manifest& m) {
         bad_chunk(m, 900);
         m.entries[950].name = "layer.949";
       },
       "entry 'layer.900' chunk 3"},
      {"a name listed twice before a chunk error",
       [&](Manifest& m) {
         bad_chunk(m, 950);
         m.entries[900].name = "layer.899";
       },
       "entry 'layer.899' is listed twice"},
      {"a bad shape before a chunk error",
       [&](Manifest& m) {
         bad_chunk(m, 960);
         m.entries[920].shape = {-80};
       },
       "entry 'layer.920': "},
      {"a bad name and bad chunks in one entry",
       [&](Manifest& m) {
         bad_chunk(m, 900);
         m.entries[900].name = std::string("layer\0900", 9);
       },
       "has a NUL byte in its name"},
      {"overlapping chunks in the last entry",
       [](Manifest& m) { m.entries.back().chunks[1].layout = Layout::FlatRange(0, 1); }, "overlaps"},
  };
  for (const Case& c : cases) {
    Manifest m = ManyChunks();
    c.damage(m);
    const Status one = ValidateManifest(m, 1), two = ValidateManifest(m, 2);
    EXPECT_EQ(one.ToString(), two.ToString()) << c.what;
    // A body built entry by entry refuses the same, in one part or two (the second from 500 on).
    EXPECT_EQ(BuildBody(m, m.entries.size()).status().ToString(), one.ToString()) << c.what;
    EXPECT_EQ(BuildBody(m, 500).status().ToString(), one.ToString()) << c.what;
    if (*c.message == '\0') {
      EXPECT_TRUE(two.ok()) << c.what << ": " << two.ToString();
    } else {
      EXPECT_THAT(two.message(), HasSubstr(c.message)) << c.what;
    }
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
  EXPECT_TRUE(CheckDataFiles(m.files, sizes(16384, false)).ok());
  Status truncated = CheckDataFiles(m.files, sizes(9000, false));
  EXPECT_EQ(truncated.code(), Code::kDataLoss);
  EXPECT_THAT(truncated.message(), HasSubstr("'rank-00000.bin' is 9000 bytes"));
  EXPECT_THAT(truncated.message(), HasSubstr("truncated"));
  Status missing = CheckDataFiles(m.files, sizes(16384, true));
  EXPECT_EQ(missing.code(), Code::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'rank-00001.bin' is missing"));
}


// ---- The text itself (issue 14 part 5): every field, stable bytes, the older layout, refusals ----

// Every field a manifest holds: flat ranges, 2-d boxes, Whole (written as the full box), a 0-d
// tensor, tied entries (one chunk under two names), packed offsets (format 1.1), global and
// per-rank blobs, metrics, creation metadata, names that need escaping or are not ASCII.
Manifest Full() {
  Manifest m = Sample();  // model.w (flat ranges), model.b (Whole), step (0-d)
  m.step = 1234567890123;
  m.created = CreationInfo{"2026-12-01T00:00:00Z", "0.1.0", "2.15.0", 3, "0123abc",
                           {{"note", "quote \" backslash \\ tab \t newline \n"}, {"unicode", "caf\xc3\xa9"}}};
  m.metrics = {{"loss", 0.125}, {"accuracy", 1.0}, {"tiny", 1.5e-300}, {"big", -2.5e300}};
  m.files[0] = FileRecord{"rank-00000.bin", 8 * 4096 + 4096, 8 * 4096, {0x0123456789abcdefULL}};
  m.files[1] = FileRecord{"rank-00001.bin", 8 * 4096 + 4096, 8 * 4096, {~uint64_t{0}}};
  EntryRecord tied = m.entries[0];
  tied.name = "lm_head.weight";  // tied to model.w: the same chunks
  m.entries.push_back(tied);
  EntryRecord q{"model.attn.\"q\"\\proj\n\x01", DType::kFloat16, {4, 6}, {}};
  q.chunks = {ChunkRecord{0, 64, 24, Layout::Box({0, 0}, {2, 6})}, ChunkRecord{1, 64, 24, Layout::Box({2, 0}, {2, 6})}};
  m.entries.push_back(q);
  m.entries.push_back(EntryRecord{"caf\xc3\xa9.\xf0\x9f\x98\x80", DType::kFloat64, {3}, {ChunkRecord{1, 8192, 24, Layout::Box({0}, {3})}}});
  m.blobs = {BlobRecord{"config", BlobScope::kGlobal, 0, 0, 12288, 100}, BlobRecord{"rng", BlobScope::kPerRank, 0, 0, 12388, 50},
             BlobRecord{"rng", BlobScope::kPerRank, 1, 1, 12288, 50}};
  return m;
}

// A manifest small enough to spell out byte for byte.
Manifest Tiny() {
  Manifest m;
  m.step = 5;
  m.world_size = 1;
  m.created.time = "t";
  m.created.shardckpt_version = "0.1.0";
  m.metrics = {{"loss", 0.25}};
  m.files.push_back(FileRecord{"rank-00000.bin", 8192, 4096, {0xab}});
  EntryRecord w{"w", DType::kFloat32, {2, 2}, {}};
  w.chunks.push_back(ChunkRecord{0, 0, 16, Layout::FlatRange(0, 4)});
  m.entries.push_back(w);
  EntryRecord b{"b", DType::kFloat32, {2}, {}};
  b.chunks.push_back(ChunkRecord{0, 16, 8, Layout::Box({0}, {2})});
  m.entries.push_back(b);
  m.blobs.push_back(BlobRecord{"cfg", BlobScope::kGlobal, 0, 0, 24, 3});
  return m;
}

const char kTinyText[] = R"({
 "format": "shardckpt",
 "format_version": [1, 1],
 "step": 5,
 "world_size": 1,
 "created": {"time": "t", "shardckpt_version": "0.1.0", "torch_version": "", "hosts": 1, "git_commit": "", "user": {}},
 "metrics": {"loss": 0.25},
 "files": [
  {"name": "rank-00000.bin", "size": 8192, "table_offset": 4096, "table_sums": "00000000000000ab"}
 ],
 "chunk_fields": "[file, offset, bytes, begin|box_offsets, end|box_sizes]",
 "entries": [
  {"name": "w", "dtype": "float32", "shape": [2,2], "chunks": [[0,0,16,0,4]]},
  {"name": "b", "dtype": "float32", "shape": [2], "chunks": [[0,16,8,[0],[2]]]}
 ],
 "blobs": [
  {"name": "cfg", "scope": "global", "rank": 0, "file": 0, "offset": 24, "bytes": 3}
 ]
})";

// Field by field; a Whole chunk reads back as the full box, so layouts are compared normalized.
void ExpectSameManifest(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.created.time, b.created.time);
  EXPECT_EQ(a.created.shardckpt_version, b.created.shardckpt_version);
  EXPECT_EQ(a.created.torch_version, b.created.torch_version);
  EXPECT_EQ(a.created.hosts, b.created.hosts);
  EXPECT_EQ(a.created.git_commit, b.created.git_commit);
  EXPECT_EQ(a.created.user, b.created.user);
  EXPECT_EQ(a.metrics, b.metrics);
  auto file = [](const FileRecord& f) { return std::tie(f.name, f.size, f.table_offset, f.table_page_sums, f.checksums); };
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) EXPECT_EQ(file(a.files[i]), file(b.files[i])) << i;
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const EntryRecord& x = a.entries[i];
    const EntryRecord& y = b.entries[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
    ASSERT_EQ(x.chunks.size(), y.chunks.size()) << x.name;
    for (size_t k = 0; k < x.chunks.size(); ++k) {
      EXPECT_EQ(x.chunks[k].file, y.chunks[k].file) << x.name;
      EXPECT_EQ(x.chunks[k].offset, y.chunks[k].offset) << x.name;
      EXPECT_EQ(x.chunks[k].bytes, y.chunks[k].bytes) << x.name;
      EXPECT_EQ(Normalize(x.chunks[k].layout, x.shape), Normalize(y.chunks[k].layout, y.shape)) << x.name;
    }
  }
  auto blob = [](const BlobRecord& x) { return std::tie(x.name, x.scope, x.rank, x.file, x.offset, x.bytes); };
  ASSERT_EQ(a.blobs.size(), b.blobs.size());
  for (size_t i = 0; i < a.blobs.size(); ++i) EXPECT_EQ(blob(a.blobs[i]), blob(b.blobs[i])) << i;
}

Manifest SampleAt0() {
  Manifest m = Sample();
  m.blobs[0].offset = 0;
  return m;
}

struct Named {
  const char* name;
  std::function<Manifest()> make;
};

const std::vector<Named>& Manifests() {
  static const std::vector<Named> all = {{"sample", SampleAt0}, {"full", Full}, {"tiny", Tiny}};
  return all;
}

TEST(ManifestText, EveryFieldRoundTrips) {
  for (const Named& c : Manifests()) {
    const Manifest m = c.make();
    Result<std::string> text = EncodeManifest(m);
    ASSERT_TRUE(text.ok()) << c.name << ": " << text.status().ToString();
    Result<Manifest> back = DecodeManifest(*text, "m.json");
    ASSERT_TRUE(back.ok()) << c.name << ": " << back.status().ToString();
    SCOPED_TRACE(c.name);
    ExpectSameManifest(*back, m);
    EXPECT_EQ(back->format_minor, UsesPackedOffsets(m) ? 1 : 0);
    Result<Manifest> shared = DecodeManifestMessage(EncodeManifestMessage(*back), "message");
    ASSERT_TRUE(shared.ok()) << shared.status().ToString();
    ExpectSameManifest(*shared, m);
  }
}

TEST(ManifestText, TheSameManifestGivesTheSameBytes) {
  EXPECT_EQ(*CheckSeal(*EncodeManifest(Tiny()), "tiny"), kTinyText);
  for (const Named& c : Manifests()) {
    const std::string text = *EncodeManifest(c.make());
    EXPECT_EQ(*EncodeManifest(c.make()), text) << c.name;
    EXPECT_EQ(*EncodeManifest(*DecodeManifest(text, "m.json")), text) << c.name;
    EXPECT_EQ(*EncodeManifest(*DecodeManifestMessage(EncodeManifestMessage(c.make()), "message")), text) << c.name;
    // Valid JSON that another program reads as the same document.
    nlohmann::json parsed = nlohmann::json::parse(text);
    EXPECT_EQ(parsed["format"], "shardckpt") << c.name;
    EXPECT_EQ(parsed["entries"].size(), c.make().entries.size()) << c.name;
    // Top-level fields on lines of their own, then one line per file, entry and blob.
    const Manifest m = c.make();
    const size_t lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    EXPECT_EQ(lines, 11 + (m.metrics.empty() ? 0 : 1) + m.files.size() + m.entries.size() + m.blobs.size() +
                         (m.files.empty() ? 0 : 1) + (m.entries.empty() ? 0 : 1) + (m.blobs.empty() ? 0 : 1))
        << c.name << "\n" << text;
  }
}

// What the writer before issue 14 wrote: nlohmann's dump(1) of the same object (keys sorted, one
// number per line), sealed the same way.
std::string OlderLayout(const std::string& sealed) {
  return SealManifestText(nlohmann::json::parse(CheckSeal(sealed, "x").value()).dump(1));
}

TEST(ManifestText, ReadsTheOlderLayout) {
  for (const Named& c : Manifests()) {
    const std::string text = *EncodeManifest(c.make());
    const std::string older = OlderLayout(text);
    ASSERT_NE(older, text);
    ASSERT_NE(older.find("\n    [\n"), std::string::npos) << older;  // one number per line
    Result<Manifest> back = DecodeManifest(older, "old/manifest.json");
    ASSERT_TRUE(back.ok()) << c.name << ": " << back.status().ToString();
    SCOPED_TRACE(c.name);
    ExpectSameManifest(*back, c.make());
    EXPECT_EQ(*EncodeManifest(*back), text);
  }
}

TEST(ManifestText, ReadsTheCommittedFormat10Checkpoint) {
  const std::string path = std::string(SHARDCKPT_FIXTURES_DIR) + "/format-1.0/step-000000000/manifest.json";
  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << path;
  std::stringstream text;
  text << file.rdbuf();
  ASSERT_NE(text.str().find("\n     0,\n"), std::string::npos);  // the older layout indeed
  Result<Manifest> m = DecodeManifest(text.str(), path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_minor, 0);
  EXPECT_EQ(m->world_size, 2);
  EXPECT_EQ(m->created.user.at("imported_from"), "source.pt");
  ASSERT_EQ(m->entries.size(), 6u);
  EXPECT_EQ(m->entries[1].name, "model.big");
  EXPECT_EQ(m->entries[1].shape, (Shape{1500, 2}));
  EXPECT_EQ(m->entries[1].chunks[1].file, 1u);
  EXPECT_EQ(m->entries[1].chunks[1].offset, 16384u);
  EXPECT_EQ(m->entries[1].chunks[1].bytes, 6000u);
  EXPECT_EQ(m->entries[1].chunks[1].layout, Layout::Box({750, 0}, {750, 2}));
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[1].name, "rank-00001.bin");
  // Written again in the new layout, it reads back the same.
  Result<Manifest> again = DecodeManifest(*EncodeManifest(*m), path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectSameManifest(*again, *m);
}

struct Edit {
  const char* what;
  std::string from, to;
  const char* message;  // empty: still accepted
};

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(ManifestText, RefusesHostileFieldsNamingWhere) {
  const std::string good = kTinyText;
  const std::string deep = std::string(70, '[') + std::string(70, ']');
  const std::vector<Edit> cases = {
      {"shape of strings", "\"shape\": [2,2]", "\"shape\": [2,\"2\"]", "entry 'w': shape holds a non-integer"},
      {"dim past int64", "\"shape\": [2,2]", "\"shape\": [2,99999999999999999999]", "entry 'w': shape holds an integer out of range (past 2^63 - 1)"},
      {"dim past int64, within u64", "\"shape\": [2,2]", "\"shape\": [2,9223372036854775808]", "entry 'w': shape holds an integer out of range (past 2^63 - 1)"},
      {"dim below int64", "\"shape\": [2,2]", "\"shape\": [2,-99999999999999999999]", "entry 'w': shape holds an integer out of range (below -2^63)"},
      {"step below int64", "\"step\": 5", "\"step\": -9223372036854775809", "step is an integer out of range (below -2^63)"},
      {"dim with a leading zero", "\"shape\": [2,2]", "\"shape\": [2,02]", "entry 'w': shape holds a non-integer"},
      {"offset with leading zeros", "[[0,0,16,0,4]]", "[[0,00,16,0,4]]", "entry 'w': chunk offset is not a non-negative integer"},
      {"offset past u64", "[[0,0,16,0,4]]", "[[0,18446744073709551616,16,0,4]]", "entry 'w': chunk offset is an integer out of range (past 2^64 - 1)"},
      {"negative offset", "[[0,0,16,0,4]]", "[[0,-4096,16,0,4]]", "chunk offset is not a non-negative integer"},
      {"float bytes", "[[0,0,16,0,4]]", "[[0,0,16.0,0,4]]", "chunk bytes is not a non-negative integer"},
      {"short chunk", "[[0,0,16,0,4]]", "[[0,0,16,0]]", "chunk is not a 5-element list"},
      {"long chunk", "[[0,0,16,0,4]]", "[[0,0,16,0,4,5]]", "chunk is not a 5-element list"},
      {"chunk not a list", "[[0,0,16,0,4]]", "[{\"file\": 0}]", "chunk is not a list"},
      {"file index past u32", "[[0,0,16,0,4]]", "[[4294967296,0,16,0,4]]", "chunk file index too large"},
      {"mixed flat bounds", "[[0,0,16,0,4]]", "[[0,0,16,0,[4]]]", "a flat range bound is a non-integer"},
      {"box sizes not a list", "[[0,16,8,[0],[2]]]", "[[0,16,8,[0],2]]", "box sizes is not a list"},
      {"box of floats", "[[0,16,8,[0],[2]]]", "[[0,16,8,[0.5],[2]]]", "box offsets holds a non-integer"},
      {"missing dtype", "\"dtype\": \"float32\", \"shape\": [2,2]", "\"shape\": [2,2]", "entry 'w': missing field 'dtype'"},
      {"twice the same field", "{\"name\": \"w\",", "{\"name\": \"w\", \"name\": \"v\",", "field 'name' appears twice"},
      {"unknown dtype", "\"dtype\": \"float32\", \"shape\": [2]", "\"dtype\": \"float33\", \"shape\": [2]", "float33"},
      {"world as text", "\"world_size\": 1", "\"world_size\": \"1\"", "world_size is not a non-negative integer"},
      {"world of zero", "\"world_size\": 1", "\"world_size\": 0", "world_size out of range"},
      {"fractional step", "\"step\": 5", "\"step\": 5.5", "step is a non-integer"},
      {"no step", " \"step\": 5,\n", "", "missing field 'step'"},
      {"no entries", "\"entries\"", "\"entrees\"", "missing field 'entries'"},
      {"entries not a list", "\"entries\": [", "\"entries\": {\"x\": 1}, \"was\": [", "entries is not a list"},
      {"top-level field twice", " \"step\": 5,\n", " \"step\": 5,\n \"step\": 6,\n", "field 'step' appears twice"},
      {"unknown blob scope", "\"scope\": \"global\"", "\"scope\": \"local\"", "blobs[0]: unknown blob scope 'local'"},
      {"blob without bytes", ", \"bytes\": 3}", "}", "blobs[0]: missing field 'bytes'"},
      {"blob rank past the limit", "\"rank\": 0", "\"rank\": 16777217", "rank or file out of range"},
      {"table sums not hex", "\"00000000000000ab\"", "\"00000000000000zz\"", "files[0]: table_sums is not hex"},
      {"table sums cut", "\"00000000000000ab\"", "\"00000000000000a\"", "not a multiple of 16"},
      {"checksums off on disk", "\"table_offset\": 4096,", "\"table_offset\": 4096, \"checksums\": false,", "'checksums' is not allowed"},
      {"metric as text", "{\"loss\": 0.25}", "{\"loss\": \"low\"}", "metric 'loss' is string, not a number"},
      {"metrics as a list", "{\"loss\": 0.25}", "[0.25]", "not an object of named numbers"},
      {"metric past a double", "{\"loss\": 0.25}", "{\"loss\": 1e999}", "metric 'loss' is a number out of a double's range"},
      {"nested too deep", "\"chunk_fields\"", "\"future\": " + deep + ",\n \"chunk_fields\"", "nested more than 64"},
      // docs/format.md: unknown fields nested at most 64 deep (65 were accepted).
      {"nested 65 deep", "\"chunk_fields\"", "\"future\": " + Nested(65) + ",\n \"chunk_fields\"", "nested more than 64"},
      {"nested 64 deep", "\"chunk_fields\"", "\"future\": " + Nested(64) + ",\n \"chunk_fields\"", ""},
      {"not UTF-8", "\"name\": \"b\"", "\"name\": \"\xff\"", "malformed manifest"},
      {"missing comma", "[[0,0,16,0,4]]", "[[0,0,16,0 4]]", "malformed manifest"},
      {"bad literal", "\"chunk_fields\"", "\"future\": tru,\n \"chunk_fields\"", "malformed manifest"},
      {"format of another program", "\"format\": \"shardckpt\"", "\"format\": \"other\"", "not a shardckpt manifest"},
      {"format as a number", "\"format\": \"shardckpt\"", "\"format\": 7", "not a shardckpt manifest"},
      {"version of three numbers", "[1, 1]", "[1, 1, 0]", "format_version must be [major, minor]"},
      {"future major version", "[1, 1]", "[2, 0]", "format version 2.0 is not supported"},
      // Still read: unknown fields anywhere, fields in any order, escaped text.
      {"unknown fields", "\"chunk_fields\"", "\"future\": {\"a\": [1, null, true, \"x\", -2.5e10, {}]},\n \"chunk_fields\"", ""},
      {"unknown entry field", "{\"name\": \"w\",", "{\"name\": \"w\", \"why\": [[1]],", ""},
      {"fields reordered", "\"name\": \"w\", \"dtype\": \"float32\"", "\"dtype\": \"float32\", \"name\": \"w\"", ""},
      {"escaped name", "\"name\": \"cfg\"", "\"name\": \"\\u0063fg\"", ""},
  };
  for (const Edit& c : cases) {
    std::string text = good;
    size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.what;
    text.replace(at, c.from.size(), c.to);
    Result<Manifest> decoded = DecodeManifest(SealManifestText(text), "ckpt/manifest.json");
    if (c.message[0] == '\0') {
      ASSERT_TRUE(decoded.ok()) << c.what << ": " << decoded.status().ToString();
      ExpectSameManifest(*decoded, Tiny());
      continue;
    }
    ASSERT_FALSE(decoded.ok()) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr("ckpt/manifest.json")) << c.what;
  }
}

// The entries list is read ahead of the general reader from after the first `,\n "entries": `
// (manifest.cc, ReadCompactEntries). That spelling inside another field is not the entries: the
// manifest means what a JSON reader says it means.
TEST(ManifestText, AnEntriesListInsideAnotherFieldIsNotTakenForTheEntries) {
  const std::string decoy =
      "\"future\": {\"x\": 1,\n \"entries\": [\n  {\"name\": \"decoy\", \"dtype\": \"float32\", \"shape\": [1], "
      "\"chunks\": [[0,0,4,0,1]]}\n ]},\n \"chunk_fields\"";
  std::string text = kTinyText;
  text.replace(text.find("\"chunk_fields\""), std::string("\"chunk_fields\"").size(), decoy);
  Result<Manifest> decoded = DecodeManifest(SealManifestText(text), "ckpt/manifest.json");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameManifest(*decoded, Tiny());

  // Without the real entries, the decoy is still not read as them.
  const size_t real = text.find(",\n \"entries\": [\n  {\"name\": \"w\"");
  ASSERT_NE(real, std::string::npos);
  text.replace(real, text.find("\n ]", real) + 3 - real, "");
  decoded = DecodeManifest(SealManifestText(text), "ckpt/manifest.json");
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(), HasSubstr("missing field 'entries'"));

  // Entries that are read ahead and entries that are not (an escaped name) read the same.
  std::string escaped = kTinyText;
  escaped.replace(escaped.find("\"name\": \"w\""), 11, "\"name\": \"\\u0077\"");
  decoded = DecodeManifest(SealManifestText(escaped), "ckpt/manifest.json");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameManifest(*decoded, Tiny());
  decoded = DecodeManifest(SealManifestText(kTinyText), "ckpt/manifest.json");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameManifest(*decoded, Tiny());
}

TEST(ManifestText, RefusesTextAfterTheObject) {
  // Sealed with the tail inside, so that the refusal comes from the reader, not the seal.
  const std::string body = CheckSeal(*EncodeManifest(Tiny()), "tiny").value();
  for (const std::string& tail : {std::string("{}"), std::string(" []"), std::string(" 1")}) {
    Result<Manifest> decoded = DecodeManifest(SealManifestText(body + tail + "\n}"), "ckpt/manifest.json");
    ASSERT_FALSE(decoded.ok()) << tail;
    EXPECT_EQ(decoded.status().code(), Code::kDataLoss) << tail;
    EXPECT_THAT(decoded.status().message(), HasSubstr("ckpt/manifest.json: malformed manifest")) << tail;
    EXPECT_THAT(decoded.status().message(), HasSubstr("text after the manifest's closing brace")) << tail;
  }
}

// A repeat save encodes its head around the kept body: the same bytes as the whole encoding,
// packed (format 1.1) or not, whatever the head's own entries and blobs are.
TEST(ManifestText, AHeadAroundAKeptBodyIsTheWholeEncoding) {
  std::vector<Named> cases = Manifests();
  cases.push_back({"unpacked", [] {
                     Manifest m = Tiny();
                     for (EntryRecord& e : m.entries) {
                       for (ChunkRecord& c : e.chunks) c.offset = 0;  // every chunk on a block: format 1.0
                     }
                     for (BlobRecord& b : m.blobs) b.offset = 0;
                     return m;
                   }});
  cases.push_back({"empty", [] {
                     Manifest m = Tiny();
                     m.entries.clear();
                     m.blobs.clear();
                     return m;
                   }});
  for (const Named& c : cases) {
    SCOPED_TRACE(c.name);
    const Manifest m = c.make();
    Result<ManifestBody> body = EncodeManifestBody(m);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(body->packed_offsets, UsesPackedOffsets(m));
    Manifest head = m;
    head.entries.clear();
    head.blobs.clear();
    head.step = 77;  // what a repeat save changes
    head.metrics = {{"loss", 0.5}};
    Manifest whole = m;
    whole.step = 77;
    whole.metrics = head.metrics;
    EXPECT_EQ(EncodeManifestWithBody(head, *body).value().Joined(), EncodeManifest(whole).value());
  }
  Manifest bad = Tiny();
  bad.entries[1].name = "b\xff";
  EXPECT_THAT(EncodeManifestBody(bad).status().message(), HasSubstr("the name of entry 1 is not valid UTF-8"));
}

// A body built entry by entry, in one part or two, is EncodeManifestBody's text.
TEST(ManifestText, ABodyBuiltEntryByEntryIsTheBodyEncoded) {
  std::vector<Named> cases = Manifests();
  cases.push_back({"many chunks", ManyChunks});
  cases.push_back({"unpacked", [] {
                     Manifest m = Tiny();
                     m.entries.pop_back();
                     m.blobs.clear();
                     return m;
                   }});
  cases.push_back({"no entries", [] {
                     Manifest m = Tiny();
                     m.entries.clear();
                     return m;
                   }});
  for (const Named& c : cases) {
    SCOPED_TRACE(c.name);
    const Manifest m = c.make();
    ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m).ToString();
    Result<ManifestBody> encoded = EncodeManifestBody(m);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    for (size_t split : {size_t{0}, m.entries.size() / 2, m.entries.size()}) {
      Result<ManifestBody> built = BuildBody(m, split);
      ASSERT_TRUE(built.ok()) << split << ": " << built.status().ToString();
      EXPECT_EQ(built->text, encoded->text) << split;
      EXPECT_EQ(built->packed_offsets, encoded->packed_offsets) << split;
    }
  }
  // A name in both parts, a name that is not UTF-8 (an entry's, a blob's): refused as encoding
  // and validation refuse them.
  Manifest twice = ManyChunks();
  twice.entries[900].name = "layer.10";
  EXPECT_THAT(BuildBody(twice, 500).status().message(), HasSubstr("entry 'layer.10' is listed twice"));
  Manifest bad = Tiny();
  bad.entries[1].name = "b\xff";
  EXPECT_THAT(BuildBody(bad, 1).status().message(), HasSubstr("the name of entry 1 is not valid UTF-8"));
  bad = Tiny();
  bad.blobs[0].name = "c\xff";
  EXPECT_THAT(BuildBody(bad, 2).status().message(), HasSubstr("the name of blob 0 is not valid UTF-8"));
}

TEST(ManifestText, EncodeRefusesNamesThatAreNotUtf8) {
  Manifest m = Tiny();
  m.entries[1].name = "b\xff";
  Result<std::string> text = EncodeManifest(m);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("the name of entry 1 is not valid UTF-8"));
  m = Tiny();
  m.created.user["k"] = "\xc0\xaf";
  EXPECT_THAT(EncodeManifest(m).status().message(), HasSubstr("creation metadata"));
}

}  // namespace
}  // namespace shardckpt
