#include "common/status.h"

#include <gtest/gtest.h>

namespace downpour {
namespace {

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = InvalidArgument("field '{}' is {}", "lr", -1);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: field 'lr' is -1");
}

TEST(StatusTest, ErrorWrapsStatus) {
  try {
    ThrowIfError(NotFound("no file {}", "/x"));
    FAIL() << "expected an exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
    EXPECT_STREQ(e.what(), "NOT_FOUND: no file /x");
  }
}

TEST(StatusCheckDeathTest, CheckAbortsWithValues) {
  EXPECT_DEATH(DP_CHECK_EQ(1 + 1, 3), "CHECK failed: 1 \\+ 1 == 3 \\(2 vs 3\\)");
}

}  // namespace
}  // namespace downpour
