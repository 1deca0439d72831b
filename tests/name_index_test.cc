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

template <typename Hash>
void ExpectIndexes(const std::vector<std::string>& names) {
  auto name_of = [&](uint32_t i) -> std::string_view { return names[i]; };
  NameIndex<decltype(name_of), Hash> index(names.size() / 5, name_of);  // grows on the way
  for (uint32_t i = 0; i < names.size(); ++i) {
    auto [value, added] = index.TryEmplace(names[i], i);
    EXPECT_TRUE(added) << names[i];
    EXPECT_EQ(value, i);
  }
  EXPECT_EQ(index.size(), names.size());
  for (uint32_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(index.Find(names[i]), i) << names[i];
    EXPECT_EQ(index.Find(names[i], index.HashOf(names[i])), i) << names[i];
  }
  // A repeat keeps the first index and says it was there.
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

TEST(NameIndex, FindsEveryNameAndKeepsTheFirstIndexOfARepeat) { ExpectIndexes<Xxh3NameHash>(Names()); }

TEST(NameIndex, NamesOnOneHashAreToldApartByTheirBytes) {
  std::vector<std::string> names = Names();
  names.resize(300);  // every probe walks the one run: keep it short
  ExpectIndexes<OneHash>(names);
}

// As a save plan uses it: a name is stored under the next index and joins the list only when it
// was new, repeats come between, and the table grows from nothing on the way.
TEST(NameIndex, GrowsWhileTheNamesArriveWithRepeats) {
  std::vector<std::string> stored;
  auto name_of = [&](uint32_t i) -> std::string_view { return stored[i]; };
  NameIndex index(0, name_of);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4000; ++i) {
      const std::string name = "rank." + std::to_string(i % (1000 * (round + 1))) + ".w";
      auto [at, added] = index.TryEmplace(name, static_cast<uint32_t>(stored.size()));
      if (added) stored.push_back(name);
      ASSERT_EQ(stored[at], name);
    }
  }
  EXPECT_EQ(stored.size(), 3000u);
  EXPECT_EQ(index.size(), 3000u);
  for (uint32_t i = 0; i < stored.size(); ++i) EXPECT_EQ(index.Find(stored[i]), i);
}

// The hint a pipelined lookup prefetches by: the index of the first slot with the name's tag.
// With distinct hashes it is the name's own index; with one hash for all, the first name's, and
// only Find, which compares names, tells them apart.
TEST(NameIndex, TheLikelyIndexIsTheNamesOwnUnlessTagsCollide) {
  const std::vector<std::string> names = Names();
  auto name_of = [&](uint32_t i) -> std::string_view { return names[i]; };
  NameIndex index(names.size(), name_of);
  NameIndex<decltype(name_of), OneHash> colliding(names.size(), name_of);
  for (uint32_t i = 0; i < names.size(); ++i) {
    index.TryEmplace(names[i], i);
    if (i < 300) colliding.TryEmplace(names[i], i);
  }
  for (uint32_t i = 0; i < names.size(); ++i) EXPECT_EQ(index.LikelyIndex(index.HashOf(names[i])), i) << names[i];
  EXPECT_EQ(index.LikelyIndex(index.HashOf("not.a.name")), decltype(index)::kAbsent);
  for (uint32_t i = 0; i < 300; ++i) {
    EXPECT_EQ(colliding.LikelyIndex(colliding.HashOf(names[i])), 0u);
    EXPECT_EQ(colliding.Find(names[i], colliding.HashOf(names[i])), i);
  }
}

TEST(NameIndex, AbsentNamesAreAbsent) {
  const std::vector<std::string> names = {"layers.0.weight"};
  auto name_of = [&](uint32_t i) -> std::string_view { return names[i]; };
  NameIndex index(0, name_of);
  EXPECT_EQ(index.Find("layers.0.weight"), decltype(index)::kAbsent);
  index.TryEmplace(names[0], 0);
  EXPECT_EQ(index.Find("layers.0.weight"), 0u);
  EXPECT_EQ(index.Find("layers.0.weigh"), decltype(index)::kAbsent);
  EXPECT_EQ(index.Find("layers.0.weightt"), decltype(index)::kAbsent);
  EXPECT_EQ(index.Find(""), decltype(index)::kAbsent);
  NameIndex<decltype(name_of), OneHash> colliding(1, name_of);
  colliding.TryEmplace(names[0], 0);
  EXPECT_EQ(colliding.Find("b"), decltype(colliding)::kAbsent);
}

}  // namespace
}  // namespace shardckpt
