#include "engine/stop_checker.h"

#include <gtest/gtest.h>

namespace se {
namespace {

TEST(StopCheckerTest, HoldsBackPossiblePrefixesAndCutsAtTheMatch) {
  StopChecker c({"\nUser:", "END"});
  std::string out;
  out += c.push("Hello");
  out += c.push(" world\nUs");
  EXPECT_EQ(out, "Hello world");  // "\nUs" may start a stop string
  out += c.push("er: next");
  EXPECT_TRUE(c.stopped());
  EXPECT_EQ(c.matched(), "\nUser:");
  EXPECT_EQ(out, "Hello world");
  EXPECT_EQ(c.push("more"), "");
}

TEST(StopCheckerTest, ReleasesFalseAlarmsAndFlushes) {
  StopChecker c({"END"});
  std::string out = c.push("EN");
  EXPECT_EQ(out, "");
  out += c.push("D");
  EXPECT_TRUE(c.stopped());
  EXPECT_EQ(out, "");

  StopChecker d({"END"});
  out = d.push("ENx");
  EXPECT_EQ(out, "ENx");
  out += d.push("E");
  EXPECT_EQ(out, "ENx");
  out += d.flush();
  EXPECT_EQ(out, "ENxE");
  EXPECT_FALSE(d.stopped());
}

}  // namespace
}  // namespace se
