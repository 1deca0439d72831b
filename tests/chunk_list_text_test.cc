#include "shardckpt/engine/model/chunk_list_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace shardckpt {
namespace {

std::vector<ChunkRecord> Read(const std::string& text, size_t* length) {
  std::vector<ChunkRecord> out;
  *length = ReadCompactChunkList(text, &out);
  return out;
}

TEST(CompactChunkList, ReadsTheFormTheWriterUses) {
  size_t length = 0;
  std::vector<ChunkRecord> chunks = Read("[[0,4096,64,0,16],[3,17,48,[-2,0,5],[2,16,123456789012345678]]]", &length);
  ASSERT_EQ(length, 63u);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].file, 0u);
  EXPECT_EQ(chunks[0].offset, 4096u);
  EXPECT_EQ(chunks[0].bytes, 64u);
  EXPECT_EQ(chunks[0].layout, Layout::FlatRange(0, 16));
  EXPECT_EQ(chunks[1].file, 3u);
  EXPECT_EQ(chunks[1].offset, 17u);
  EXPECT_EQ(chunks[1].bytes, 48u);
  EXPECT_EQ(chunks[1].layout, Layout::Box({-2, 0, 5}, {2, 16, 123456789012345678}));

  // A 0-d tensor's box, an empty list, a box of more dims than are stored inline, text after the
  // list (the rest of the manifest), the largest file index.
  chunks = Read("[[4294967295,0,4,[],[]]]}, more", &length);
  EXPECT_EQ(length, 24u);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].file, 4294967295u);
  EXPECT_EQ(chunks[0].layout, Layout::Box({}, {}));
  EXPECT_TRUE(Read("[]", &length).empty());
  EXPECT_EQ(length, 2u);
  chunks = Read("[[1,2,3,[0,0,0,0,0,0,1],[1,1,1,1,1,1,1]]]", &length);
  EXPECT_EQ(length, 41u);
  EXPECT_EQ(chunks.at(0).layout, Layout::Box({0, 0, 0, 0, 0, 0, 1}, {1, 1, 1, 1, 1, 1, 1}));
}

// Anything else is left to the general reader: spaces (an older writer's indented text), numbers
// it would refuse or read differently, another shape of list.
TEST(CompactChunkList, LeavesEveryOtherSpellingToTheGeneralReader) {
  const std::vector<std::string> others = {
      "",
      " [[0,0,4,0,1]]",
      "[ [0,0,4,0,1]]",
      "[[0, 0,4,0,1]]",
      "[[0,0,4,0,1] ]",
      "[[0,0,4,[0 ],[1]]]",
      "[[0,0,4,0,1],]",
      "[,]",
      "[[0,0,4,0,1]",
      "[[0,0,4,0]]",
      "[[0,0,4,0,1,2]]",
      "[[0,0,4,[0],1]]",
      "[[0,0,4,0,[1]]]",
      "[[0,0,4,[0,],[1]]]",
      "[[01,0,4,0,1]]",
      "[[0,-0,4,0,1]]",
      "[[0,0,-4,0,1]]",
      "[[+1,0,4,0,1]]",
      "[[0,0,4,--1,1]]",
      "[[0,0,4,-,1]]",
      "[[0,0,4.0,0,1]]",
      "[[0,0,4e2,0,1]]",
      "[[0,0,4,0,1E1]]",
      "[[4294967296,0,4,0,1]]",
      "[[0,1234567890123456789,4,0,1]]",
      "[[0,0,4,0,-1234567890123456789]]",
      "[[\"0\",0,4,0,1]]",
      "[[0,0,4,null,1]]",
      "[{\"file\":0}]",
      "[[0,0,4,[[0]],[1]]]",
  };
  for (const std::string& text : others) {
    size_t length = 1;
    Read(text, &length);
    EXPECT_EQ(length, 0u) << text;
  }
}

// What the general reader (engine/model/manifest.cc) makes of a chunk list, or nothing where it
// refuses it: file an unsigned integer up to UINT32_MAX, offset and bytes unsigned 64-bit,
// then two signed integers or two lists of them.
std::optional<std::vector<ChunkRecord>> GeneralReading(const nlohmann::json& list) {
  auto i64 = [](const nlohmann::json& v, int64_t* out) {
    if (!v.is_number_integer()) return false;
    *out = v.get<int64_t>();
    return true;
  };
  auto u64 = [](const nlohmann::json& v, uint64_t* out) {
    if (!v.is_number_unsigned()) return false;
    *out = v.get<uint64_t>();
    return true;
  };
  auto dims = [&](const nlohmann::json& v, Dims* out) {
    if (!v.is_array()) return false;
    for (const auto& x : v) {
      int64_t i = 0;
      if (!i64(x, &i)) return false;
      out->push_back(i);
    }
    return true;
  };
  if (!list.is_array()) return std::nullopt;
  std::vector<ChunkRecord> out;
  for (const auto& c : list) {
    if (!c.is_array() || c.size() != 5) return std::nullopt;
    ChunkRecord r;
    uint64_t file = 0;
    if (!u64(c[0], &file) || file > UINT32_MAX || !u64(c[1], &r.offset) || !u64(c[2], &r.bytes)) return std::nullopt;
    r.file = static_cast<uint32_t>(file);
    if (c[3].is_array()) {
      Dims offsets, sizes;
      if (!dims(c[3], &offsets) || !dims(c[4], &sizes)) return std::nullopt;
      r.layout = Layout::Box(offsets, sizes);
    } else {
      int64_t begin = 0, end = 0;
      if (!i64(c[3], &begin) || !i64(c[4], &end)) return std::nullopt;
      r.layout = Layout::FlatRange(begin, end);
    }
    out.push_back(r);
  }
  return out;
}

// Changes up to two random bytes of `text` to letters of `alphabet`, then reads it with `read` (a
// compact reader: the length it read, 0 for "not mine"). What a JSON library makes of the text the
// compact reader took (discarded when the library refuses it), or nothing when it took none.
template <typename Read>
std::optional<nlohmann::json> ChangeAndRead(std::mt19937_64& rng, const std::string& alphabet, std::string* text, Read read) {
  const int changes = static_cast<int>(rng() % 3);
  for (int c = 0; c < changes; ++c) (*text)[rng() % text->size()] = alphabet[rng() % alphabet.size()];
  const size_t length = read(*text);
  if (length == 0) return std::nullopt;
  return nlohmann::json::parse(text->substr(0, length), nullptr, false);
}

// Random compact lists with random bytes changed: whatever the compact reader accepts, a JSON
// library reads to the same chunks, so falling back can never change what a manifest means.
TEST(CompactChunkList, AcceptsOnlyWhatTheGeneralReaderReadsTheSame) {
  std::mt19937_64 rng(14);
  const std::string alphabet = "0123456789-,[] .e+\"";
  auto number = [&]() -> std::string {
    switch (rng() % 4) {
      case 0: return std::to_string(rng() % 10);
      case 1: return std::to_string(static_cast<int64_t>(rng() % 2000000) - 1000000);
      case 2: return std::to_string(rng() % 5000000000ull);
      default: return std::to_string(rng() >> (rng() % 64));
    }
  };
  int accepted = 0, refused = 0;
  for (int round = 0; round < 40000; ++round) {
    std::string text = "[";
    const int chunks = static_cast<int>(rng() % 4);
    for (int k = 0; k < chunks; ++k) {
      text += k ? ",[" : "[";
      text += number() + "," + number() + "," + number() + ",";
      if (rng() % 2) {
        text += number() + "," + number();
      } else {
        const int dims = static_cast<int>(rng() % 4);
        for (int half = 0; half < 2; ++half) {
          text += half ? ",[" : "[";
          for (int d = 0; d < dims; ++d) text += (d ? "," : "") + number();
          text += "]";
        }
      }
      text += "]";
    }
    text += "]";
    std::vector<ChunkRecord> read;
    const std::optional<nlohmann::json> parsed =
        ChangeAndRead(rng, alphabet, &text, [&](const std::string& t) { return ReadCompactChunkList(t, &read); });
    if (!parsed.has_value()) {
      ++refused;
      continue;
    }
    ++accepted;
    ASSERT_FALSE(parsed->is_discarded()) << text;
    const std::optional<std::vector<ChunkRecord>> general = GeneralReading(*parsed);
    ASSERT_TRUE(general.has_value()) << text;
    ASSERT_EQ(general->size(), read.size()) << text;
    for (size_t k = 0; k < read.size(); ++k) {
      EXPECT_EQ((*general)[k].file, read[k].file) << text;
      EXPECT_EQ((*general)[k].offset, read[k].offset) << text;
      EXPECT_EQ((*general)[k].bytes, read[k].bytes) << text;
      EXPECT_EQ((*general)[k].layout, read[k].layout) << text;
    }
  }
  // Both sides of the property were exercised.
  EXPECT_GT(accepted, 5000);
  EXPECT_GT(refused, 5000);
}

// ---- The entries list ----

std::vector<EntryRecord> ReadEntries(const std::string& text, size_t* length) {
  std::vector<EntryRecord> out;
  *length = ReadCompactEntryList(text, &out);
  return out;
}

TEST(CompactEntryList, ReadsTheFormTheWriterUses) {
  const std::string list =
      "[\n  {\"name\": \"w\", \"dtype\": \"float32\", \"shape\": [2,2], \"chunks\": [[0,0,16,0,4]]},\n"
      "  {\"name\": \"caf\xc3\xa9 b\", \"dtype\": \"bfloat16\", \"shape\": [], \"chunks\": [[1,16,2,[],[]]]},\n"
      "  {\"name\": \"\", \"dtype\": \"int64\", \"shape\": [0], \"chunks\": []}\n ]";
  size_t length = 0;
  std::vector<EntryRecord> entries = ReadEntries(list + ",\n \"blobs\": []", &length);
  ASSERT_EQ(length, list.size());
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "w");
  EXPECT_EQ(entries[0].dtype, DType::kFloat32);
  EXPECT_EQ(entries[0].shape, (Shape{2, 2}));
  ASSERT_EQ(entries[0].chunks.size(), 1u);
  EXPECT_EQ(entries[0].chunks[0].layout, Layout::FlatRange(0, 4));
  EXPECT_EQ(entries[1].name, "caf\xc3\xa9 b");
  EXPECT_EQ(entries[1].dtype, DType::kBFloat16);
  EXPECT_TRUE(entries[1].shape.empty());
  ASSERT_EQ(entries[1].chunks.size(), 1u);
  EXPECT_EQ(entries[1].chunks[0].file, 1u);
  EXPECT_EQ(entries[1].chunks[0].layout, Layout::Box({}, {}));
  EXPECT_EQ(entries[2].name, "");
  EXPECT_TRUE(entries[2].chunks.empty());
  EXPECT_TRUE(ReadEntries("[]", &length).empty());
  EXPECT_EQ(length, 2u);
}

// The list is sized once, from its lines; a text of bare newlines reserves by its size, not its
// line count.
TEST(CompactEntryList, IsSizedOnceAndAHostileTextReservesLittle) {
  std::string list = "[";
  for (int i = 0; i < 1000; ++i) {
    list += std::string(i ? ",\n  " : "\n  ") + "{\"name\": \"t" + std::to_string(i) +
            "\", \"dtype\": \"float32\", \"shape\": [1], \"chunks\": [[0," + std::to_string(4 * i) + ",4,0,1]]}";
  }
  list += "\n ]";
  std::vector<EntryRecord> entries;
  ASSERT_EQ(ReadCompactEntryList(list + ",\n \"blobs\": [\n  {}\n ]", &entries), list.size());
  ASSERT_EQ(entries.size(), 1000u);
  EXPECT_EQ(entries.capacity(), 1000u);
  EXPECT_EQ(entries[999].chunks[0].offset, 3996u);
  EXPECT_EQ(entries[999].chunks.get_allocator().arena(), nullptr);  // 100 KB of text: on the heap
  // Newlines and no close: nothing reserved. Newlines, then a close: at most a 61st of the size.
  const std::string open = "[\n  " + std::string(96000, '\n');
  std::vector<EntryRecord> fresh;
  EXPECT_EQ(ReadCompactEntryList(open, &fresh), 0u);
  EXPECT_LE(fresh.capacity(), 1u);  // the one entry it tried to read
  const std::string closed = open + "\n ]";
  EXPECT_EQ(ReadCompactEntryList(closed, &fresh), 0u);
  EXPECT_LE(fresh.capacity(), closed.size() / 61);
  EXPECT_GT(fresh.capacity(), 1u);
  // Not the compact form at all: no scan, nothing reserved.
  std::vector<EntryRecord> other;
  EXPECT_EQ(ReadCompactEntryList("[\n {\"name\": \"w\"}\n ]" + std::string(1000, '\n'), &other), 0u);
  EXPECT_EQ(other.capacity(), 0u);
}

// A list of several MiB read on 2 to 7 threads gives what one thread reads, field by field; a
// flaw in any part refuses the whole list, as it does on one thread.
TEST(CompactEntryList, ReadsTheSameOnManyThreads) {
  std::mt19937_64 rng(7);
  const char* const dtypes[] = {"float32", "bfloat16", "int64", "bool"};
  std::string list = "[";
  for (int i = 0; i < 40000; ++i) {
    list += std::string(i ? ",\n  " : "\n  ") + "{\"name\": \"layers." + std::to_string(i) + ".w\", \"dtype\": \"" +
            dtypes[rng() % 4] + "\", \"shape\": [" + std::to_string(i % 7 + 1) + ",3], \"chunks\": [";
    const int chunks = static_cast<int>(rng() % 4);
    for (int k = 0; k < chunks; ++k) {
      list += (k ? ",[" : "[") + std::to_string(rng() % 64) + "," + std::to_string(rng() % 100000000) + "," +
              std::to_string(rng() % 1000) + (k % 2 ? ",[0,1],[2,3]]" : "," + std::to_string(k) + ",9]");
    }
    list += "]}";
  }
  list += "\n ]";
  const std::string text = list + ",\n \"blobs\": [\n  {}\n ]";
  ASSERT_GT(list.size(), size_t{4} << 20);
  std::vector<EntryRecord> one;
  ASSERT_EQ(ReadCompactEntryList(text, &one, 1), list.size());
  ASSERT_EQ(one.size(), 40000u);
  // A list this large puts its chunks in an arena (record_arena.h): one for one thread, one per
  // part for several, so that no two threads share one.
  auto arenas_of = [](const std::vector<EntryRecord>& entries) {
    std::set<const RecordArena*> arenas;
    for (const EntryRecord& e : entries) arenas.insert(e.chunks.get_allocator().arena().get());
    return arenas;
  };
  EXPECT_EQ(arenas_of(one).size(), 1u);
  EXPECT_EQ(arenas_of(one).count(nullptr), 0u);
  for (size_t threads : {2, 3, 4, 7}) {
    std::vector<EntryRecord> many;
    ASSERT_EQ(ReadCompactEntryList(text, &many, threads), list.size()) << threads;
    ASSERT_EQ(many.size(), one.size()) << threads;
    EXPECT_EQ(arenas_of(many).size(), std::min(threads, list.size() >> 20));  // a part is 1 MiB at least
    EXPECT_EQ(arenas_of(many).count(nullptr), 0u);
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(many[i].name, one[i].name) << threads;
      ASSERT_EQ(many[i].dtype, one[i].dtype) << one[i].name;
      ASSERT_EQ(many[i].shape, one[i].shape) << one[i].name;
      ASSERT_EQ(many[i].chunks.size(), one[i].chunks.size()) << one[i].name;
      for (size_t k = 0; k < one[i].chunks.size(); ++k) {
        ASSERT_EQ(many[i].chunks[k].file, one[i].chunks[k].file) << one[i].name;
        ASSERT_EQ(many[i].chunks[k].offset, one[i].chunks[k].offset) << one[i].name;
        ASSERT_EQ(many[i].chunks[k].bytes, one[i].chunks[k].bytes) << one[i].name;
        ASSERT_EQ(many[i].chunks[k].layout, one[i].chunks[k].layout) << one[i].name;
      }
    }
  }
  // Flaws at a fifth, a half and near the end, and a separator with one space too few.
  for (double at : {0.2, 0.5, 0.97}) {
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"\"float32\"", "\"float33\""}, {"\"bool\"", "\"bool \""}, {",\n  {", ",\n {"}, {"]]}", "]] }"}}) {
      std::string flawed = text;
      const size_t where = flawed.find(from, static_cast<size_t>(static_cast<double>(list.size()) * at));
      ASSERT_LT(where, list.size());
      flawed.replace(where, from.size(), to);
      for (size_t threads : {1, 2, 4}) {
        std::vector<EntryRecord> read;
        EXPECT_EQ(ReadCompactEntryList(flawed, &read, threads), 0u) << from << " at " << at << ", " << threads << " threads";
      }
    }
  }
}

// Names with something to unescape or not UTF-8, another spacing or order, an unknown dtype or
// field: all left to the general reader.
TEST(CompactEntryList, LeavesEveryOtherSpellingToTheGeneralReader) {
  const std::string entry = "{\"name\": \"w\", \"dtype\": \"float32\", \"shape\": [2], \"chunks\": [[0,0,8,0,2]]}";
  auto list = [](const std::string& e) { return "[\n  " + e + "\n ]"; };
  size_t length = 0;
  ReadEntries(list(entry), &length);
  ASSERT_NE(length, 0u);
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"\"w\"", "\"\\u0077\""},
      {"\"w\"", "\"a\\\"b\""},
      {"\"w\"", "\"tab\there\""},
      {"\"w\"", "\"\xff\""},
      {"\"w\"", "\"\xc3\""},
      {"\"w\"", "\"\xed\xa0\x80\""},  // a UTF-16 surrogate spelled in UTF-8
      {"\"float32\"", "\"float33\""},
      {"\"float32\"", "\"Float32\""},
      {"{\"name\"", "{ \"name\""},
      {"\"name\": \"w\", \"dtype\": \"float32\"", "\"dtype\": \"float32\", \"name\": \"w\""},
      {"[2]", "[ 2]"},
      {"[2]", "[2.0]"},
      {"[2]", "2"},
      {"]]}", "]], \"why\": 1}"},
      {"]]}", "]] }"},
      {"[[0,0,8,0,2]]", "[[0,0,8,0,2] ]"},
  };
  for (const auto& [from, to] : edits) {
    std::string text = list(entry);
    text.replace(text.find(from), from.size(), to);
    ReadEntries(text, &length);
    EXPECT_EQ(length, 0u) << text;
  }
  for (const std::string& text : std::vector<std::string>{"[" + entry + "]", "[\n  " + entry + "]", "[\n  " + entry + "\n]",
                                  "[\n  " + entry + ",\n  \n ]", "[\n  " + entry + ",\n " + entry + "\n ]",
                                  "[\n  " + entry, "[\n ]", "[ ]", ""}) {
    ReadEntries(text, &length);
    EXPECT_EQ(length, 0u) << text;
  }
}

// Random entries lists with random bytes changed: whatever the compact reader accepts, a JSON
// library reads to the same entries, so reading ahead can never change what a manifest means.
TEST(CompactEntryList, AcceptsOnlyWhatTheGeneralReaderReadsTheSame) {
  std::mt19937_64 rng(15);
  std::string alphabet = "0123456789-,[]{} :\"\\\n\tabnu\xc3\xa9\xff";
  alphabet.push_back('\0');
  const std::vector<std::string> dtypes = {"float32", "bfloat16", "int8", "bool", "float8_e4m3fn", "complex64"};
  int accepted = 0, refused = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = "[";
    const int entries = static_cast<int>(rng() % 3) + 1;
    for (int i = 0; i < entries; ++i) {
      text += i ? ",\n  {\"name\": \"" : "\n  {\"name\": \"";
      const int name = static_cast<int>(rng() % 6);
      const char* const name_parts[] = {"a", "b", ".", "_", "\xc3\xa9", "\xf0\x9f\x98\x80"};
      for (int c = 0; c < name; ++c) text += name_parts[rng() % 6];
      text += "\", \"dtype\": \"" + dtypes[rng() % dtypes.size()] + "\", \"shape\": [";
      const int dims = static_cast<int>(rng() % 3);
      for (int d = 0; d < dims; ++d) text += (d ? "," : "") + std::to_string(rng() % 100);
      text += "], \"chunks\": [";
      const int chunks = static_cast<int>(rng() % 3);
      for (int k = 0; k < chunks; ++k) {
        text += (k ? ",[" : "[") + std::to_string(rng() % 4) + "," + std::to_string(rng() % 100000) + "," +
                std::to_string(rng() % 1000) + "," + std::to_string(rng() % 50) + "," + std::to_string(rng() % 50) + "]";
      }
      text += "]}";
    }
    text += "\n ]";
    std::vector<EntryRecord> read;
    const std::optional<nlohmann::json> parsed =
        ChangeAndRead(rng, alphabet, &text, [&](const std::string& t) { return ReadCompactEntryList(t, &read); });
    if (!parsed.has_value()) {
      ++refused;
      continue;
    }
    ++accepted;
    ASSERT_FALSE(parsed->is_discarded()) << text;
    ASSERT_TRUE(parsed->is_array()) << text;
    ASSERT_EQ(parsed->size(), read.size()) << text;
    for (size_t i = 0; i < read.size(); ++i) {
      const nlohmann::json& e = (*parsed)[i];
      ASSERT_TRUE(e.is_object() && e.size() == 4) << text;
      EXPECT_EQ(e.at("name").get<std::string>(), read[i].name) << text;
      EXPECT_EQ(e.at("dtype").get<std::string>(), DTypeName(read[i].dtype)) << text;
      EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), read[i].shape) << text;
      const std::optional<std::vector<ChunkRecord>> chunks = GeneralReading(e.at("chunks"));
      ASSERT_TRUE(chunks.has_value()) << text;
      ASSERT_EQ(chunks->size(), read[i].chunks.size()) << text;
      for (size_t k = 0; k < chunks->size(); ++k) {
        EXPECT_EQ((*chunks)[k].offset, read[i].chunks[k].offset) << text;
        EXPECT_EQ((*chunks)[k].layout, read[i].chunks[k].layout) << text;
      }
    }
  }
  EXPECT_GT(accepted, 3000);
  EXPECT_GT(refused, 3000);
}

}  // namespace
}  // namespace shardckpt
