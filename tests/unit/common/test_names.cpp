// The shared "did you mean" pieces (edit distance, nearest and likely names, the phrase) and
// join(), checked against hand-computed answers.
#include "titan/common/format.h"
#include "titan/common/names.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace titan {
namespace test_names {

TEST(Names, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("steps", "steps"), 0u);
  EXPECT_EQ(edit_distance("stesp", "steps"), 2u);       // a swap is two substitutions
  EXPECT_EQ(edit_distance("trainig", "training"), 1u);  // one insertion
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);  // a deletion and an insertion
  EXPECT_EQ(edit_distance("lawn", "flaw"), 2u);  // symmetric
}

TEST(Names, NearestNameTakesTheEarlierOnATie) {
  EXPECT_EQ(nearest_name("trainig", {"job", "training", "metrics"}), "training");
  EXPECT_EQ(nearest_name("ab", {"xb", "ay"}), "xb");
  EXPECT_EQ(nearest_name("ab", {"ay", "xb"}), "ay");
  EXPECT_EQ(nearest_name("zzzzzz", {"a"}), "a");  // however far
  EXPECT_EQ(nearest_name("x", {}), "");
}

TEST(Names, LikelyNameNeedsAPrefixOrAFewEdits) {
  const std::vector<std::string> known = {"auto", "jsonl", "sotu", "sotu_validation", "text"};
  EXPECT_EQ(likely_name("sotu_val", known), "sotu_validation");  // a prefix beats distance
  EXPECT_EQ(likely_name("sotuu", known), "sotu");
  EXPECT_EQ(likely_name("jsnol", known), "jsonl");
  EXPECT_EQ(likely_name("zzz", known), "");
  EXPECT_EQ(likely_name("", known), "");  // "" starts every name but suggests none
  // Up to max(2, length / 3) edits: 4 for a 12-letter name, 2 for a short one.
  EXPECT_EQ(likely_name("abcdefghXXXX", {"abcdefghijkl"}), "abcdefghijkl");
  EXPECT_EQ(likely_name("abcdefgXXXXX", {"abcdefghijkl"}), "");
  EXPECT_EQ(likely_name("aXX", {"abc"}), "abc");
  EXPECT_EQ(likely_name("XXX", {"abc"}), "");
  EXPECT_EQ(likely_name("te", {"jsonl", "text", "tokens"}), "text");  // the first extension
}

TEST(Names, DidYouMean) {
  EXPECT_EQ(did_you_mean("training"), "; did you mean 'training'?");
  EXPECT_EQ(did_you_mean(""), "");
}

TEST(Format, Join) {
  EXPECT_EQ(join(std::vector<std::string>{"a", "b", "c"}), "a, b, c");
  EXPECT_EQ(join(std::vector<std::string>{"dp", "tp"}, "="), "dp=tp");
  EXPECT_EQ(join(std::vector<int64_t>{1, -3, 7}, " "), "1 -3 7");
  EXPECT_EQ(join(std::vector<int>{4}), "4");
  EXPECT_EQ(join(std::vector<std::string>{}), "");
  EXPECT_EQ(join(std::vector<std::string>{"", ""}, "+"), "+");
}

}  // namespace test_names
}  // namespace titan
