// env_is and env_int: the environment switches read as the backends read them.
#include "kernels/env_switch.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace exl {
namespace env_switch_test {

constexpr const char* k_name = "EXL_ENV_SWITCH_TEST_VALUE";

TEST(EnvSwitch, IsMatchesTheWholeValueOnly) {
  ::unsetenv(k_name);
  EXPECT_FALSE(env_is(k_name, "0"));
  EXPECT_FALSE(env_is(k_name, ""));
  ::setenv(k_name, "0", 1);
  EXPECT_TRUE(env_is(k_name, "0"));
  EXPECT_FALSE(env_is(k_name, "00"));
  ::setenv(k_name, "", 1);
  EXPECT_TRUE(env_is(k_name, ""));
  EXPECT_FALSE(env_is(k_name, "0"));
  ::unsetenv(k_name);
}

TEST(EnvSwitch, IntIsTheFallbackOnlyWhereUnset) {
  ::unsetenv(k_name);
  EXPECT_EQ(env_int(k_name, 64), 64);
  ::setenv(k_name, "16", 1);
  EXPECT_EQ(env_int(k_name, 64), 16);
  ::setenv(k_name, "-1", 1);
  EXPECT_EQ(env_int(k_name, 64), -1);
  ::setenv(k_name, "12abc", 1);
  EXPECT_EQ(env_int(k_name, 64), 12);
  ::setenv(k_name, "", 1);
  EXPECT_EQ(env_int(k_name, 64), 0);
  ::setenv(k_name, "abc", 1);
  EXPECT_EQ(env_int(k_name, 64), 0);
  ::unsetenv(k_name);
}

}  // namespace env_switch_test
}  // namespace exl
