// Number formatting and dtype names shared by the log lines and `inspect`.
#include "titan/common/check.h"
#include "titan/common/format.h"

#include <gtest/gtest.h>

namespace titan {
namespace format_test {

TEST(Format, WithCommas) {
  EXPECT_EQ(with_commas(8030261248), "8,030,261,248");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(-1234567), "-1,234,567");
  EXPECT_EQ(with_commas(0), "0");
}

TEST(Format, HumanCount) {
  EXPECT_EQ(human_count(8030261248), "8.03B");
  EXPECT_EQ(human_count(6163712), "6.16M");
  EXPECT_EQ(human_count(2048), "2.0K");
}

TEST(Format, DtypeFromName) {
  EXPECT_EQ(dtype_from_name("bfloat16"), c10::kBFloat16);
  EXPECT_EQ(dtype_from_name("float32"), c10::kFloat);
  EXPECT_THROW(dtype_from_name("fp8"), ConfigError);
}

}  // namespace format_test
}  // namespace titan
