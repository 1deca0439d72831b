#include "shardckpt/engine/formats/gguf_writer.h"

#include <gtest/gtest.h>

#include <cstring>

namespace shardckpt {
namespace {

// Little-endian fields, spelled out independently of the writer.
struct Bytes {
  std::string s;
  Bytes& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
    return *this;
  }
  Bytes& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
    return *this;
  }
  Bytes& str(const std::string& text) {
    u64(text.size());
    s += text;
    return *this;
  }
};

GgufKeyValue Text(const std::string& key, const std::string& value) {
  GgufKeyValue kv{key, {}};
  kv.value.text = value;
  return kv;
}

TEST(GgufHeader, BytesAsTheSpecLaysThemOut) {
  GgufKeyValue layers{"llama.block_count", {}};
  layers.value.kind = GgufValue::Kind::kInt;
  layers.value.integer = 2;
  GgufKeyValue eps{"llama.eps", {}};
  eps.value.kind = GgufValue::Kind::kFloat;
  eps.value.real = 0.5;
  GgufKeyValue neg{"x.neg", {}};
  neg.value.kind = GgufValue::Kind::kInt;
  neg.value.integer = -3;
  GgufKeyValue flag{"x.flag", {}};
  flag.value.kind = GgufValue::Kind::kBool;
  flag.value.flag = true;
  std::vector<GgufKeyValue> meta = {Text("general.architecture", "llama"), Text("general.name", "t"), layers, eps, neg, flag};
  std::vector<GgufTensorInfo> tensors = {{"a.weight", DType::kBFloat16, {3, 5}},  // 30 bytes, padded to 32
                                         {"b", DType::kFloat32, {}},              // 0-d: [1], 4 bytes
                                         {"c", DType::kFloat16, {2, 1, 3}}};
  Result<std::string> header = EncodeGgufHeader(meta, tensors);
  ASSERT_TRUE(header.ok()) << header.status().ToString();

  Bytes want;
  want.s = "GGUF";
  want.u32(3).u64(3).u64(7);
  want.str("general.architecture").u32(8).str("llama");
  want.str("general.name").u32(8).str("t");
  want.str("llama.block_count").u32(4).u32(2);  // UINT32
  float half = 0.5f;
  uint32_t half_bits;
  std::memcpy(&half_bits, &half, 4);
  want.str("llama.eps").u32(6).u32(half_bits);  // FLOAT32
  want.str("x.neg").u32(5).u32(static_cast<uint32_t>(-3));  // INT32
  want.str("x.flag").u32(7);
  want.s += '\x01';                                  // BOOL
  want.str("general.alignment").u32(4).u32(32);
  want.str("a.weight").u32(2).u64(5).u64(3).u32(30).u64(0);  // dims innermost first, BF16
  want.str("b").u32(1).u64(1).u32(0).u64(32);                 // F32 at 32
  want.str("c").u32(3).u64(3).u64(1).u64(2).u32(1).u64(64);   // F16 at 32 + 32
  want.s.append((32 - want.s.size() % 32) % 32, '\0');
  EXPECT_EQ(*header, want.s);
  EXPECT_EQ(header->size() % 32, 0u);
  EXPECT_EQ(GgufPadding(30), 2u);
  EXPECT_EQ(GgufPadding(64), 0u);
}

TEST(GgufHeader, RefusesWhatGgufOutputCannotHoldByName) {
  std::vector<GgufKeyValue> meta = {Text("general.architecture", "llama")};
  auto refused = [&](const GgufTensorInfo& t) {
    Result<std::string> r = EncodeGgufHeader(meta, {t});
    EXPECT_FALSE(r.ok()) << t.name;
    return r.ok() ? std::string() : r.status().message();
  };
  // An integer tensor cannot be cast by --dtype: only excluding it is offered; float64 can.
  EXPECT_TRUE(refused({"idx", DType::kInt64, {4}}).find("tensor 'idx' is int64") != std::string::npos &&
              refused({"idx", DType::kInt64, {4}}).find("--dtype") == std::string::npos);
  EXPECT_NE(refused({"d", DType::kFloat64, {4}}).find("exclude it (--exclude; Python exclude=), or cast it (--dtype; dtype=)"), std::string::npos);
  EXPECT_NE(refused({"q", DType::kFloat8E4M3, {4}}).find("tensor 'q' is float8_e4m3fn"), std::string::npos);
  EXPECT_NE(refused({std::string(64, 'n'), DType::kFloat32, {4}}).find("1 to 63 bytes"), std::string::npos);
  EXPECT_NE(refused({"deep", DType::kFloat32, {1, 1, 1, 1, 1}}).find("tensor 'deep' has 5 dims"), std::string::npos);
  // GGUF strings are UTF-8 (gguf-py and llama.cpp decode them): a name cut inside a character,
  // a metadata value that is not text.
  EXPECT_NE(refused({"\xa8\xa1.w", DType::kFloat32, {4}}).find("its name is not valid UTF-8"), std::string::npos);
  Result<std::string> bad_arch = EncodeGgufHeader({Text("general.architecture", "\xff")}, {});
  ASSERT_FALSE(bad_arch.ok());
  EXPECT_NE(bad_arch.status().message().find("GGUF metadata 'general.architecture' (--gguf-arch, --gguf-name or "
                                             "--gguf-metadata) is not valid UTF-8"),
            std::string::npos);
  Result<std::string> no_arch = EncodeGgufHeader({Text("general.name", "x")}, {});
  ASSERT_FALSE(no_arch.ok());
  EXPECT_NE(no_arch.status().message().find("general.architecture"), std::string::npos);
  Result<std::string> twice = EncodeGgufHeader({Text("general.architecture", "a"), Text("general.architecture", "b")}, {});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("given twice"), std::string::npos);
}

// The general.* keys the specification types: llama.cpp refuses a non-string architecture.
TEST(GgufHeader, GeneralKeysHaveTheirSpecifiedTypes) {
  GgufKeyValue numeric_arch{"general.architecture", {}};
  numeric_arch.value.kind = GgufValue::Kind::kInt;
  numeric_arch.value.integer = 5;
  Result<std::string> r = EncodeGgufHeader({numeric_arch}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "GGUF metadata key 'general.architecture' must be a string (the GGUF specification; "
                                  "llama.cpp refuses the file otherwise), not an integer");
  GgufKeyValue file_type{"general.file_type", {}};
  file_type.value.kind = GgufValue::Kind::kFloat;
  r = EncodeGgufHeader({Text("general.architecture", "llama"), Text("general.author", "me"), file_type}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "GGUF metadata key 'general.file_type' must be an unsigned 32-bit integer (the GGUF specification)");
  file_type.value.kind = GgufValue::Kind::kInt;
  file_type.value.integer = 1;
  EXPECT_TRUE(EncodeGgufHeader({Text("general.architecture", "llama"), file_type}, {}).ok());
  EXPECT_EQ(ParseGgufMetadataJson(R"({"a": null})", "m.json").status().message(),
            "m.json: GGUF metadata key 'a' holds null; only strings, integers (64-bit), floats and bools are written");
}

TEST(GgufMetadataJson, TypedValuesInFileOrder) {
  Result<std::vector<GgufKeyValue>> kv =
      ParseGgufMetadataJson(R"({"z.s": "v", "a.i": 7, "m.f": 1.5, "b.b": false})", "meta.json");
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  ASSERT_EQ(kv->size(), 4u);
  EXPECT_EQ((*kv)[0].key, "z.s");
  EXPECT_EQ((*kv)[0].value.text, "v");
  EXPECT_EQ((*kv)[1].value.kind, GgufValue::Kind::kInt);
  EXPECT_EQ((*kv)[1].value.integer, 7);
  EXPECT_EQ((*kv)[2].value.kind, GgufValue::Kind::kFloat);
  EXPECT_EQ((*kv)[3].value.kind, GgufValue::Kind::kBool);
  for (const char* bad : {R"({"k": [1]})", R"({"k": {"x": 1}})", R"({"k": null})", "[1]", "{"}) {
    Result<std::vector<GgufKeyValue>> r = ParseGgufMetadataJson(bad, "meta.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("meta.json: ", 0), 0u) << r.status().message();
  }
  // Values that would be written as something else: an integer literal past 64 bits (parsed as
  // a double), a float past FLOAT32's range (inf). 1e21 is a float as written, and fits.
  EXPECT_EQ(ParseGgufMetadataJson(R"({"ok": 1, "v": 1180591620717411303424})", "m.json").status().message(),
            "m.json: GGUF metadata key 'v = 1180591620717411303424' is an integer past 64 bits; only strings, "
            "integers (64-bit), floats and bools are written");
  EXPECT_EQ(ParseGgufMetadataJson(R"({"v": 1e40})", "m.json").status().message(),
            "m.json: GGUF metadata key 'v' holds 1e+40, past the range of FLOAT32, the type floats are written as");
  EXPECT_EQ(ParseGgufMetadataJson(R"({"v": 1e-50})", "m.json").status().message(),
            "m.json: GGUF metadata key 'v' holds 1e-50, too small for FLOAT32, the type floats are written as");
  EXPECT_TRUE(ParseGgufMetadataJson(R"({"v": 1e21, "w": -9223372036854775808, "z": 0.0, "s": 1e-40})", "m.json").ok());
}

TEST(GgufMetadataWith, FlagsWinAndComeFirst) {
  std::vector<GgufKeyValue> file = {Text("x.a", "1"), Text("general.name", "file"), Text("general.architecture", "gpt2")};
  std::vector<GgufKeyValue> merged = GgufMetadataWith("llama", "", file);
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].key, "general.architecture");
  EXPECT_EQ(merged[0].value.text, "llama");
  EXPECT_EQ(merged[1].key, "general.name");
  EXPECT_EQ(merged[1].value.text, "file");
  EXPECT_EQ(merged[2].key, "x.a");
  EXPECT_EQ(GgufMetadataWith("", "", {}).size(), 0u);
}

}  // namespace
}  // namespace shardckpt
