// The user-error helpers of check.h: message() streams its parts as TITAN_CHECK does, and
// TITAN_CONFIG_CHECK throws ConfigError (exit code 2) with them only when its condition fails.
#include "titan/common/check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace titan {
namespace test_check {

TEST(Check, MessageStreamsItsParts) {
  const int64_t n = 16, t = 3;
  EXPECT_EQ(message("n_heads ", n, " % ", t, " = ", n % t), "n_heads 16 % 3 = 1");
  EXPECT_EQ(message("key '", std::string("a.b"), "'"), "key 'a.b'");
  EXPECT_EQ(message(), "");
}

TEST(Check, MessageWritesBytesAsNumbersAndCharsAsCharacters) {
  const int8_t small = -3;
  const uint8_t byte = 200;
  EXPECT_EQ(message("width ", small, ", code ", byte, ", sep '", ',', "'"),
            "width -3, code 200, sep ','");
  EXPECT_EQ(message("eps ", 1e-5, ", factor ", 0.5, ", whole ", 2.0),
            "eps 1e-05, factor 0.5, whole 2");
}

TEST(Check, ConfigCheckThrowsConfigErrorOnlyWhenItFails) {
  int evaluated = 0;
  const auto check = [&](int64_t len, int64_t t) {
    TITAN_CONFIG_CHECK(len % t == 0, "training.seq_len ", len, " must be divisible by ", t, " (",
                       ++evaluated, ")");
  };
  EXPECT_NO_THROW(check(32, 4));
  EXPECT_EQ(evaluated, 0);  // the parts are built only on failure
  try {
    check(30, 4);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "training.seq_len 30 must be divisible by 4 (1)");
  }
  // Usable as the one statement of an if without braces.
  if (evaluated == 1) TITAN_CONFIG_CHECK(true, "never");
  else ADD_FAILURE() << "else bound to the macro's if";
}

}  // namespace test_check
}  // namespace titan
