// Issue 28 (grammar DoS): counted repetitions in patterns were expanded into nested optionals
// whose subset construction is quadratic in the count ("^[a-z]{1,65535}$": minutes, ~10 GB), and
// nothing bounded or cancelled a compilation. Checks the budget (states, bytes, time, cancel),
// that it is charged while automata are built, and that the repetition forms stay exact.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "grammar/grammar_budget.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"

namespace exl {
namespace grammar_budget_test {

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

std::string pattern_schema(const std::string& pattern) {
  return nlohmann::ordered_json{{"type", "string"}, {"pattern", pattern}}.dump();
}

TEST(GrammarBudget, LongBoundedRepeatInAPatternIsBuiltInLinearSpace) {
  GrammarBudget b;
  b.max_bytes = size_t(64) << 20;  // the nested expansion charged gigabytes here
  GrammarBudgetScope scope(b);
  Grammar g = compile_json_schema_text(pattern_schema("^[a-z]{1,65535}$"));
  EXPECT_LT(grammar_spent().bytes, size_t(64) << 20);
  EXPECT_TRUE(test::grammar_accepts(g, in_quotes("abc")));
  EXPECT_TRUE(test::grammar_accepts(g, in_quotes(std::string(65535, 'q'))));
  EXPECT_FALSE(test::grammar_accepts(g, in_quotes(std::string(65536, 'q'))));
  EXPECT_FALSE(test::grammar_accepts(g, in_quotes("")));
  EXPECT_FALSE(test::grammar_accepts(g, in_quotes("aBc")));
}

TEST(GrammarBudget, RepeatTooLargeForTheStateLimitIsRefusedBeforeExpansion) {
  GrammarBudgetScope scope(GrammarBudget{});
  try {
    compile_json_schema_text(pattern_schema("^.{0,100000}$"));
    FAIL() << "compiled";
  } catch (const GrammarError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("^.{0,100000}$"), std::string::npos) << m;
    EXPECT_NE(m.find("repetition {0,100000}"), std::string::npos) << m;
    EXPECT_NE(m.find("limit of 200000"), std::string::npos) << m;
  }
  EXPECT_LT(grammar_spent().states, size_t(1000));  // nothing of the 100000 copies was built
}

TEST(GrammarBudget, ChainedRepeatsMatchExactlyTheCounts) {
  const std::string s = pattern_schema("^(ab|c){17,20}$");
  auto reps = [](int n) {
    std::string t;
    for (int i = 0; i < n; ++i) t += i % 2 ? "c" : "ab";
    return in_quotes(t);
  };
  EXPECT_FALSE(test::schema_accepts(s, reps(16)));
  for (int n = 17; n <= 20; ++n) EXPECT_TRUE(test::schema_accepts(s, reps(n))) << n;
  EXPECT_FALSE(test::schema_accepts(s, reps(21)));
  const std::string nullable = pattern_schema("^(a?){17,18}$");
  EXPECT_TRUE(test::schema_accepts(nullable, in_quotes("")));
  EXPECT_TRUE(test::schema_accepts(nullable, in_quotes(std::string(18, 'a'))));
  EXPECT_FALSE(test::schema_accepts(nullable, in_quotes(std::string(19, 'a'))));
  const std::string unbounded = pattern_schema("^x{18,}$");
  EXPECT_FALSE(test::schema_accepts(unbounded, in_quotes(std::string(17, 'x'))));
  EXPECT_TRUE(test::schema_accepts(unbounded, in_quotes(std::string(40, 'x'))));
}

TEST(GrammarBudget, StateAndByteLimitsStopTheCompilation) {
  JsonSchemaOptions o;
  o.budget.max_states = 50;
  try {
    compile_json_schema_text(pattern_schema("^[a-z]{1,500}$"), o);
    FAIL() << "compiled";
  } catch (const GrammarBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 50 automaton states"), std::string::npos) << e.what();
  }
  o.budget = {};
  o.budget.max_bytes = size_t(1) << 20;
  try {
    compile_json_schema_text(pattern_schema("^[a-z]{1,60000}$"), o);
    FAIL() << "compiled";
  } catch (const GrammarBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 1 MiB"), std::string::npos) << e.what();
  }
  GrammarBudget tiny;
  tiny.max_states = 5;
  EXPECT_THROW(compile_regex_grammar("(cat|dog|bird)s? [0-9]+", tiny), GrammarBudgetError);
}

TEST(GrammarBudget, TimeLimitStopsTheCompilation) {
  JsonSchemaOptions o;
  o.budget.timeout = std::chrono::milliseconds(1);
  o.budget.cancelled = [] {  // the first poll outlasts the deadline
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return false;
  };
  try {
    compile_json_schema_text(pattern_schema("^[a-z]{1,5000}$"), o);
    FAIL() << "compiled";
  } catch (const GrammarBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the limit of 1 ms"), std::string::npos) << e.what();
  }
}

TEST(GrammarBudget, CancellationIsTypedEvenWhenCaughtAndRethrownInside) {
  JsonSchemaOptions o;
  int polls = 0;
  o.budget.cancelled = [&] { return ++polls >= 1; };
  // the pattern's automaton is built inside a catch that rewraps errors as json_schema errors
  EXPECT_THROW(compile_json_schema_text(pattern_schema("^[a-z]{1,5000}$"), o), GrammarCancelled);
  EXPECT_GE(polls, 1);
  o.budget.cancelled = [] { return false; };
  EXPECT_NO_THROW(compile_json_schema_text(pattern_schema("^[a-z]{1,5000}$"), o));
}

TEST(GrammarBudget, AnOuterScopeGovernsNestedCompilations) {
  GrammarBudget outer;
  outer.max_states = 20;
  GrammarBudgetScope scope(outer);
  EXPECT_THROW(compile_json_schema_text(R"({"type":"object","properties":{"a":{"type":"integer"}}})"),
               GrammarBudgetError);
}

TEST(GrammarBudget, UnsatisfiableSchemasAcceptNothing) {
  EXPECT_TRUE(accepts_nothing(compile_json_schema_text(R"({"type":"string","minLength":5,"maxLength":2})")));
  EXPECT_TRUE(accepts_nothing(compile_json_schema_text(R"({"allOf":[{"type":"string"},{"type":"integer"}]})")));
  EXPECT_FALSE(accepts_nothing(compile_json_schema_text(R"({"type":"string","maxLength":2})")));
}

}  // namespace grammar_budget_test
}  // namespace exl
