#include "shardckpt/engine/model/utf8_text.h"

#include <gtest/gtest.h>

#include "shardckpt/engine/model/json_text.h"

namespace shardckpt {
namespace {

// Sequences at the edges of validity: the first and last of each length, and the forms RFC 3629
// refuses (overlong, surrogates, past U+10FFFF, cut short).
TEST(Utf8Text, SequenceLengths) {
  struct Case {
    const char* bytes;
    size_t length;
  };
  const Case cases[] = {{"a", 1},         {"\x7f", 1},          {"\xc2\x80", 2},         {"\xdf\xbf", 2},
                        {"\xc0\x80", 0},  {"\xc1\xbf", 0},     {"\xe0\xa0\x80", 3},     {"\xe0\x9f\xbf", 0},
                        {"\xed\x9f\xbf", 3}, {"\xed\xa0\x80", 0}, {"\xef\xbf\xbf", 3},     {"\xf0\x90\x80\x80", 4},
                        {"\xf0\x8f\xbf\xbf", 0}, {"\xf4\x8f\xbf\xbf", 4}, {"\xf4\x90\x80\x80", 0}, {"\xf5\x80\x80\x80", 0},
                        {"\x80", 0},       {"\xe2\x82", 0}};
  for (const Case& c : cases) {
    EXPECT_EQ(Utf8SequenceLength(c.bytes, 0), c.length) << testing::PrintToString(std::string(c.bytes));
  }
}

// Names a format stores as text: a --strip-prefix ending inside a character leaves none.
TEST(Utf8Text, WholeTextValidity) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("model.layers.0"));
  EXPECT_TRUE(IsUtf8("\xe6\xa8\xa1\xe5\x9e\x8b"));       // 模型
  EXPECT_FALSE(IsUtf8("\xa8\xa1\xe5\x9e\x8b"));           // 模 cut after its first byte
  EXPECT_FALSE(IsUtf8("\xe6"));                              // a prefix ending inside a character
  EXPECT_FALSE(IsUtf8(std::string("a\xff" "b")));
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));                    // a surrogate
}

// Text that only informs is kept readable: each byte that starts no valid sequence becomes one
// U+FFFD, valid sequences around it stay, and the result is always accepted as JSON text.
TEST(Utf8Text, ReplacesBytesThatAreNotUtf8) {
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(Utf8OrReplaced("plain/\xc3\xa9"), "plain/\xc3\xa9");
  EXPECT_EQ(Utf8OrReplaced("/ckpt-\xff/x"), "/ckpt-" + fffd + "/x");
  EXPECT_EQ(Utf8OrReplaced("\xc3"), fffd);                     // cut short
  EXPECT_EQ(Utf8OrReplaced("\xed\xa0\x80"), fffd + fffd + fffd);  // a surrogate: three bytes, none valid
  EXPECT_EQ(Utf8OrReplaced("ok\xe2\x82"), "ok" + fffd + fffd);
  std::string out;
  EXPECT_TRUE(AppendJsonString(&out, Utf8OrReplaced("a\xff\x80\xf0\x9f\x98\x80")));
}

// What Python's pickle writes for os.fsdecode(b"/ck-\xff\x80/\xc3\xa9"): the surrogates
// U+DCFF and U+DC80 in "surrogatepass" UTF-8, the valid sequence as it is.
TEST(Utf8Text, PathsAsPythonPicklesThem) {
  EXPECT_EQ(PythonPathText("/ck-\xff\x80/\xc3\xa9"), "/ck-\xed\xb3\xbf\xed\xb2\x80/\xc3\xa9");
  EXPECT_EQ(PythonPathText("plain"), "plain");
}

}  // namespace
}  // namespace shardckpt
