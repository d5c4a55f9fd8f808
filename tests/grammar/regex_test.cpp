#include <gtest/gtest.h>

#include <memory>

#include "grammar/grammar_error.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace exl {
namespace regex_test {

bool full_match(std::string_view pattern, std::string_view text) {
  auto g = std::make_shared<CompiledGrammar>(compile_regex_grammar(pattern), nullptr);
  Matcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

bool search_match(std::string_view pattern, std::string_view text) {
  GrammarBuilder gb;
  int32_t r = gb.add_rule("p");
  gb.frags(r).set_root(emit_regex(gb, r, pattern, {.search = true}));
  auto g = std::make_shared<CompiledGrammar>(gb.finish(r), nullptr);
  Matcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

TEST(GrammarRegex, LiteralsClassesAndQuantifiers) {
  EXPECT_TRUE(full_match("abc", "abc"));
  EXPECT_FALSE(full_match("abc", "abcd"));
  EXPECT_FALSE(full_match("abc", "ab"));
  EXPECT_TRUE(full_match("a|bc", "bc"));
  EXPECT_TRUE(full_match("[a-c]+x?", "abcabc"));
  EXPECT_TRUE(full_match("[a-c]+x?", "cx"));
  EXPECT_FALSE(full_match("[a-c]+x?", "x"));
  EXPECT_TRUE(full_match("[^a-c]", "d"));
  EXPECT_FALSE(full_match("[^a-c]", "b"));
  EXPECT_TRUE(full_match("\\d{3}-\\d{2,}", "123-45678"));
  EXPECT_FALSE(full_match("\\d{3}-\\d{2,}", "123-4"));
  EXPECT_TRUE(full_match("(?:ab){2}", "abab"));
  EXPECT_TRUE(full_match("(?<n>x)y", "xy"));
  EXPECT_TRUE(full_match("\\w+\\s\\W", "ab_9 !"));
  EXPECT_TRUE(full_match("a.c", "a\xC3\xA9" "c"));
  EXPECT_FALSE(full_match("a.c", "a\nc"));
  EXPECT_TRUE(full_match("[\\u00e0-\\u00ff]", "\xC3\xA9"));
  EXPECT_TRUE(full_match("\\u{1F600}", "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(full_match("[\\u00e0-\\u00ff]", "\xC3"));  // half a character is not a match
  EXPECT_TRUE(full_match("^abc$", "abc"));
}

TEST(GrammarRegex, LargeCountsUseCounters) {
  std::string s(5000, 'a');
  EXPECT_TRUE(full_match("a{1,100000}", s));
  EXPECT_FALSE(full_match("a{5001,100000}", s));
  EXPECT_TRUE(full_match("a{5000}", s));
  EXPECT_FALSE(full_match("a{4999}", s));
  Grammar g = compile_regex_grammar("(ab|c){2,90000}");
  EXPECT_LT(g.total_states(), 100u);
}

TEST(GrammarRegex, SearchSemantics) {
  EXPECT_TRUE(search_match("b", "abc"));
  EXPECT_FALSE(search_match("^b", "abc"));
  EXPECT_TRUE(search_match("^a", "abc"));
  EXPECT_FALSE(search_match("b$", "abc"));
  EXPECT_TRUE(search_match("c$", "abc"));
  EXPECT_TRUE(search_match("^a|z$", "abc"));
  EXPECT_FALSE(search_match("^b|z$", "abc"));
}

TEST(GrammarRegex, UnsupportedConstructsNamePosition) {
  auto msg = [](std::string_view p) {
    try {
      compile_regex_grammar(p);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(msg("(a)\\1"), "grammar: regex: '(a)\\1' at 3: backreferences are not supported");
  EXPECT_NE(msg("a(?=b)").find("at 3: look-around"), std::string::npos);
  EXPECT_NE(msg("(?<!a)b").find("look-around"), std::string::npos);
  EXPECT_NE(msg("\\bfoo").find("word boundaries"), std::string::npos);
  EXPECT_NE(msg("\\p{L}").find("Unicode property"), std::string::npos);
  EXPECT_NE(msg("a(b").find("missing ')'"), std::string::npos);
  EXPECT_NE(msg("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(msg("a?^b").find("anchors"), std::string::npos);
  EXPECT_NE(msg("[z-a]").find("out of order"), std::string::npos);
}

// Search alternatives share one prefix and suffix (an automaton the size of the alternatives, not
// 2^n: the time-zone pattern had ~10^6 states); a group that is a whole alternative may hold
// anchors.
TEST(GrammarRegex, SearchAlternativesAndGroupedAnchors) {
  const std::string tz = "UTC|(Africa/[A-Za-z]+)|(America/[A-Za-z]+)|(Asia/[A-Za-z]+)|(Europe/[A-Za-z]+)|"
                         "(Indian/[A-Za-z]+)|(Pacific/[A-Za-z]+)|(Arctic/[A-Za-z]+)";
  GrammarBuilder gb;
  int32_t r = gb.add_rule("p");
  gb.frags(r).set_root(emit_regex(gb, r, tz, {.search = true, .byte_only = true}));
  Rule d = determinize_bytes(gb.nfa(r), "p", 200000);
  EXPECT_LT(d.states.size(), 2000u);
  EXPECT_TRUE(accepts_bytes(d, "x Europe/Rome y"));
  EXPECT_TRUE(accepts_bytes(d, "UTC"));
  EXPECT_FALSE(accepts_bytes(d, "Europe/"));
  EXPECT_TRUE(search_match("^$|(^[a-z]+$)", ""));
  EXPECT_TRUE(search_match("^$|(^[a-z]+$)", "abc"));
  EXPECT_FALSE(search_match("^$|(^[a-z]+$)", "ab1"));
  EXPECT_TRUE(search_match("(?:^a$)|(b$)", "xb"));
  EXPECT_FALSE(search_match("(?:^a$)|(b$)", "xa"));
  EXPECT_TRUE(search_match("^([^,]|$)", ""));
  EXPECT_TRUE(search_match("^([^,]|$)", "a,"));
  EXPECT_FALSE(search_match("^([^,]|$)", ",a"));
  EXPECT_FALSE(search_match("/^[0-9]{4}$/", "/2024/"));  // '^' after a character never holds
  EXPECT_FALSE(search_match("/^[0-9]{4}$/", "2024"));
  EXPECT_TRUE(search_match("a(^b)|c", "xc"));
  EXPECT_FALSE(search_match("a(^b)|c", "ab"));
  EXPECT_THROW(search_match("a*(^b)", "b"), GrammarError);  // '^' after what may be empty
}

}  // namespace regex_test
}  // namespace exl
