#include "shardckpt/io/size_text.h"

#include <gtest/gtest.h>

namespace shardckpt {
namespace {

TEST(ParseByteSize, UnitsAsPeopleTypeThem) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"4096", 4096},         {"512B", 512},         {"5KB", 5000},          {"2MB", 2000000},
      {"3GB", 3000000000ull}, {"4KiB", 4096},        {"8MiB", 8ull << 20},   {"1GiB", 1ull << 30},
      {"2k", 2048},           {"2K", 2048},          {"1.5M", 3ull << 19},   {"2G", 2ull << 30}};
  for (const auto& [text, bytes] : cases) {
    Result<uint64_t> parsed = ParseByteSize(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, bytes) << text;
  }
}

TEST(ParseByteSize, RefusesWhatIsNotASize) {
  for (const char* text : {"", "GiB", "0", "-1MiB", "5 GB", "5gb", "5TiB", "nan", "1e30"}) {
    Result<uint64_t> parsed = ParseByteSize(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find("bad size"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace shardckpt
