#include "shardckpt/engine/model/name_index.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardckpt {
namespace {

// Every name on one hash: each lookup must tell names apart by comparing them.
struct OneHash {
  uint64_t operator()(std::string_view) const { return 7; }
};

template <typename Index>
void ExpectIndexes(const std::vector<std::string>& names) {
  Index index(names.size() / 3);  // grows on the way
  for (size_t i = 0; i < names.size(); ++i) {
    auto [value, added] = index.TryEmplace(names[i], i);
    EXPECT_TRUE(added) << names[i];
    EXPECT_EQ(value, i);
  }
  EXPECT_EQ(index.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(index.Find(names[i]), i) << names[i];
  // A repeat keeps the first value and says it was there.
  auto [value, added] = index.TryEmplace(names.back(), 12345);
  EXPECT_FALSE(added);
  EXPECT_EQ(value, names.size() - 1);
  EXPECT_EQ(index.size(), names.size());
}

std::vector<std::string> Names() {
  std::vector<std::string> names = {"", "a", "ab", "layers.0.weight", "layers.0.weightx", std::string("nul\0inside", 10),
                                    std::string("nul\0inside", 3), "state.step"};
  for (int i = 0; i < 5000; ++i) names.push_back("model.layers." + std::to_string(i) + ".bias");
  return names;
}

TEST(NameIndex, FindsEveryNameAndKeepsTheFirstValueOfARepeat) { ExpectIndexes<NameIndex>(Names()); }

TEST(NameIndex, NamesOnOneHashAreToldApartByTheirBytes) {
  std::vector<std::string> names = Names();
  names.resize(300);  // every probe walks the one run: keep it short
  ExpectIndexes<BasicNameIndex<OneHash>>(names);
}

TEST(NameIndex, AbsentNamesAreAbsent) {
  NameIndex index;
  EXPECT_EQ(index.Find("x"), NameIndex::kAbsent);
  index.TryEmplace("layers.0.weight", 0);
  EXPECT_EQ(index.Find("layers.0.weigh"), NameIndex::kAbsent);
  EXPECT_EQ(index.Find("layers.0.weightt"), NameIndex::kAbsent);
  EXPECT_EQ(index.Find(""), NameIndex::kAbsent);
  BasicNameIndex<OneHash> colliding;
  colliding.TryEmplace("a", 0);
  EXPECT_EQ(colliding.Find("b"), NameIndex::kAbsent);
}

}  // namespace
}  // namespace shardckpt
