#include "shardckpt/engine/model/json_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace shardckpt {
namespace {

std::string Quoted(std::string_view text) {
  std::string out = "prefix";
  EXPECT_TRUE(AppendJsonString(&out, text)) << text;
  return out.substr(6);
}

TEST(JsonText, EscapesWhatJsonRequiresAndNothingElse) {
  struct Case {
    std::string text;
    std::string json;
  };
  const std::vector<Case> cases = {
      {"", "\"\""},
      {"model.layers.0.weight", "\"model.layers.0.weight\""},
      {"a\"b\\c", "\"a\\\"b\\\\c\""},
      {"\b\f\n\r\t", "\"\\b\\f\\n\\r\\t\""},
      {std::string("\0\x01\x1f", 3), "\"\\u0000\\u0001\\u001f\""},
      {"/\x7f", "\"/\x7f\""},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},
  };
  for (const Case& c : cases) EXPECT_EQ(Quoted(c.text), c.json) << c.json;
}

TEST(JsonText, RefusesTextThatIsNotUtf8AndLeavesTheOutputAlone) {
  const std::vector<std::string> bad = {
      "\xff", "a\x80", "\xc3", "\xc0\xaf" /* overlong */, "\xe0\x80\xaf", "\xed\xa0\x80" /* surrogate */,
      "\xf4\x90\x80\x80" /* past U+10FFFF */, "\xf0\x9f\x98", "ok\xe2\x82",
  };
  for (const std::string& text : bad) {
    std::string out = "kept";
    EXPECT_FALSE(AppendJsonString(&out, text)) << nlohmann::json(std::vector<uint8_t>(text.begin(), text.end())).dump();
    EXPECT_EQ(out, "kept");
  }
}

// Whatever it accepts, a JSON library reads back unchanged; whatever it refuses, the library
// refuses too.
TEST(JsonText, AgreesWithAJsonLibraryOnRandomBytes) {
  std::mt19937 rng(5);
  const std::string alphabet = std::string("a\"\\\n\x01\x7f", 6) + "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xff\x80";
  for (int round = 0; round < 20000; ++round) {
    std::string text;
    const int length = static_cast<int>(rng() % 8);
    for (int i = 0; i < length; ++i) text.push_back(alphabet[rng() % alphabet.size()]);
    std::string out;
    const bool ok = AppendJsonString(&out, text);
    bool library_ok = true;
    try {
      (void)nlohmann::json(text).dump();
    } catch (const nlohmann::json::exception&) {
      library_ok = false;
    }
    ASSERT_EQ(ok, library_ok) << round;
    if (ok) {
      ASSERT_EQ(nlohmann::json::parse(out).get<std::string>(), text) << out;
      ASSERT_EQ(out, nlohmann::json(text).dump()) << out;  // the same spelling, not only the same value
    }
  }
}

TEST(JsonText, WritesNumbersThatReadBackExactly) {
  struct Case {
    double value;
    const char* json;
  };
  const std::vector<Case> cases = {{0.5, "0.5"}, {1, "1.0"}, {-3, "-3.0"}, {0.1, "0.1"}, {1e20, "1e+20"},
                                   {1.5e-7, "1.5e-07"}, {std::nan(""), "null"},
                                   {std::numeric_limits<double>::infinity(), "null"}};
  for (const Case& c : cases) {
    std::string out;
    AppendJsonDouble(&out, c.value);
    EXPECT_EQ(out, c.json);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, 8);
    if (!std::isfinite(value)) continue;
    std::string out;
    AppendJsonDouble(&out, value);
    ASSERT_EQ(nlohmann::json::parse(out).get<double>(), value) << out;
  }
  std::string ints;
  AppendJsonUint(&ints, UINT64_MAX);
  ints.push_back(' ');
  AppendJsonInt(&ints, INT64_MIN);
  EXPECT_EQ(ints, "18446744073709551615 -9223372036854775808");
}

}  // namespace
}  // namespace shardckpt

