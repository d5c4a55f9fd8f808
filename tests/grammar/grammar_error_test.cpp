// Issue 26: one error root. Every grammar error is an exl::Error, so a caller catches one type;
// the kinds stay apart by type, and the messages are what they were.
#include <gtest/gtest.h>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace exl {
namespace grammar_error_test {

TEST(GrammarError, EveryKindIsAnExlError) {
  static_assert(std::is_base_of_v<Error, GrammarError>);
  static_assert(std::is_base_of_v<GrammarError, GrammarBudgetError>);
  static_assert(std::is_base_of_v<GrammarError, GrammarCancelled>);
  try {
    compile_regex_grammar("(ab");
    FAIL() << "an unclosed group compiled";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const GrammarError*>(&e), nullptr);
    EXPECT_EQ(e.layer(), "grammar");
    EXPECT_EQ(std::string(e.what()).rfind("grammar: regex: ", 0), 0u) << e.what();
    EXPECT_EQ(e.concept_name(), "regex");
  }
}

// The typed kinds arrive through a catch of the root with their types intact.
TEST(GrammarError, BudgetAndCancellationStayApartInsideTheRoot) {
  GrammarBudget tiny;
  tiny.max_states = 5;
  try {
    compile_regex_grammar("(cat|dog|bird)s? [0-9]+", tiny);
    FAIL() << "compiled past a 5-state budget";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const GrammarBudgetError*>(&e), nullptr) << e.what();
    EXPECT_EQ(dynamic_cast<const GrammarCancelled*>(&e), nullptr) << e.what();
    EXPECT_EQ(e.concept_name(), "budget");
  }
  JsonSchemaOptions gone;
  gone.budget.cancelled = [] { return true; };
  try {
    compile_json_schema_text(R"({"type": "string", "pattern": "^[a-z]{1,5000}$"})", gone);
    FAIL() << "compiled though cancelled";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const GrammarCancelled*>(&e), nullptr) << e.what();
  }
}

TEST(GrammarError, GrammarFailKeepsTheMessage) {
  try {
    grammar_fail("grammar: matcher: rollback(", 3, ") past the start (", 2, " steps)");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "grammar: matcher: rollback(3) past the start (2 steps)");
    EXPECT_EQ(e.concept_name(), "matcher");
  }
}

}  // namespace grammar_error_test
}  // namespace exl
