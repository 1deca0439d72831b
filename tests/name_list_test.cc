#include "shardckpt/engine/model/name_list.h"

#include <gtest/gtest.h>

namespace shardckpt {
namespace {

std::vector<std::string> Names(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back("t" + std::to_string(i));
  return names;
}

TEST(NameList, QuotesUpToTwentyThenCounts) {
  struct Case {
    int names;
    std::string expected_end;
  } cases[] = {{0, ""}, {1, "'t0'"}, {2, "'t0', 't1'"}, {20, "'t18', 't19'"}, {25, "'t19', and 5 more"}};
  for (const Case& c : cases) {
    std::string list = NameList(Names(c.names));
    EXPECT_EQ(list.substr(list.size() - c.expected_end.size()), c.expected_end) << c.names;
    EXPECT_EQ(list.find("'t20'"), std::string::npos) << c.names;
  }
}

// With notes, each name carries its own, and the list still stops at twenty.
TEST(NameList, EachNameWithItsNote) {
  EXPECT_EQ(NameList({"w", "b"}, {"2 of 4 elements", "1 of 2 elements"}), "'w' (2 of 4 elements), 'b' (1 of 2 elements)");
  const std::vector<std::string> notes(25, "x");
  const std::string list = NameList(Names(25), notes);
  EXPECT_EQ(list.substr(list.size() - 21), "'t19' (x), and 5 more");
  EXPECT_EQ(list.find("'t20'"), std::string::npos);
}

}  // namespace
}  // namespace shardckpt
