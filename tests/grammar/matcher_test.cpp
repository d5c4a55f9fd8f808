#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace exl {
namespace matcher_test {

// A small vocabulary with the awkward cases: single bytes (byte fallback), multi-byte UTF-8
// split across tokens, tokens spanning JSON structure (`":`, `"}`, `,"`), a leading-space token,
// an empty (special) token and two EOS ids.
std::vector<std::string> vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (const char* t : {"{\"", "\":", "\"}", ",\"", "\":\"", "\",\"", "name", "age", " name", "true", "null", "12",
                        "\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC", "\xE2\x82\xAC", "\"\xC3\xA9", "ab", "abc", "\"]",
                        "[\"", "\"a", "1,", "},{", "{}", "[]", "\",", "0", "00", "-1", ".5", "e+"})
    v.push_back(t);
  v.push_back("");  // a special token: never allowed
  v.push_back("<eos>");
  v.push_back("<eot>");
  return v;
}

std::shared_ptr<const TokenIndex> index() {
  auto v = vocab();
  int32_t n = int32_t(v.size());
  return std::make_shared<TokenIndex>(v, std::vector<int32_t>{n - 2, n - 1});
}

// Checks fill_mask against accepting each token on a copy of the matcher.
void check_masks_along(std::shared_ptr<const CompiledGrammar> g, const std::vector<int32_t>& path) {
  const TokenIndex& ix = *g->index();
  Matcher m(g);
  std::vector<uint32_t> mask(ix.mask_words());
  for (size_t step = 0; step <= path.size(); ++step) {
    std::fill(mask.begin(), mask.end(), 0);
    m.fill_mask(mask);
    for (int32_t t = 0; t < int32_t(ix.vocab_size()); ++t) {
      Matcher copy = m;
      bool ok = copy.accept(t);
      bool bit = mask[size_t(t) / 32] >> (t % 32) & 1;
      ASSERT_EQ(bit, ok) << "step " << step << " token " << t << " '" << ix.bytes(t) << "'";
    }
    if (step < path.size()) {
      ASSERT_TRUE(m.accept(path[step])) << "step " << step;
    }
  }
}

std::vector<int32_t> ids_of(const std::vector<std::string>& pieces) {
  auto v = vocab();
  std::vector<int32_t> out;
  for (const auto& p : pieces) out.push_back(int32_t(std::find(v.begin(), v.end(), p) - v.begin()));
  return out;
}

TEST(GrammarMatcher, MaskEqualsPerTokenAcceptOnJson) {
  Grammar gr = compile_json_schema_text(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},"age":{"type":"integer","minimum":-1}},
          "required":["name"],"additionalProperties":false})");
  auto g = std::make_shared<CompiledGrammar>(std::move(gr), index());
  check_masks_along(g, ids_of({"{\"", "name", "\":\"", "\xC3", "\xA9", "\xE2\x82\xAC", "\",\"", "age", "\":", "-1", "}"}));
}

// Bounded strings exercise the sliced masks: positions where every short string-text token fits,
// where only tokens up to the remaining length fit (UTF-8 characters counted once), and patterns.
TEST(GrammarMatcher, MaskEqualsPerTokenAcceptOnBoundedStrings) {
  Grammar gr = compile_json_schema_text(
      R"({"type":"array","items":{"anyOf":[{"type":"string","minLength":2,"maxLength":6},
          {"type":"string","pattern":"^(ab|\\u00e9)*c?$","maxLength":5}]}})");
  auto g = std::make_shared<CompiledGrammar>(std::move(gr), index());
  check_masks_along(g, ids_of({"[\"", "ab", "\xC3\xA9", "\xE2\x82", "\xAC", "a", "\",\"", "abc", "\xC3", "\xA9", "\"]"}));
}

TEST(GrammarMatcher, RandomWalksAgreeWithAccept) {
  Grammar gr = compile_json_schema_text(
      R"({"type":"array","items":{"anyOf":[{"type":"string","pattern":"^a+b?$"},{"type":"number"},{"$ref":"#"}]},"maxItems":4})");
  auto g = std::make_shared<CompiledGrammar>(std::move(gr), index());
  std::mt19937 rng(7);
  const TokenIndex& ix = *g->index();
  for (int walk = 0; walk < 20; ++walk) {
    Matcher m(g);
    std::vector<int32_t> path;
    for (int step = 0; step < 12; ++step) {
      std::vector<uint32_t> mask(ix.mask_words());
      m.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < int32_t(ix.vocab_size()); ++t)
        if (mask[size_t(t) / 32] >> (t % 32) & 1) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty());
      int32_t t = allowed[rng() % allowed.size()];
      if (ix.is_eos(t)) break;
      path.push_back(t);
      ASSERT_TRUE(m.accept(t));
    }
    check_masks_along(g, path);
  }
}

TEST(GrammarMatcher, EosOnlyWhenAcceptingAndRollback) {
  auto g = std::make_shared<CompiledGrammar>(compile_regex_grammar("ab(c|d)"), index());
  Matcher m(g);
  int32_t eos = int32_t(vocab().size()) - 2;
  EXPECT_FALSE(m.accept(eos));
  EXPECT_EQ(m.forced_bytes(), "ab");
  EXPECT_TRUE(m.accept(ids_of({"ab"})[0]));
  EXPECT_EQ(m.forced_bytes(), "");
  EXPECT_FALSE(m.is_accepting());
  EXPECT_TRUE(m.accept(ids_of({"c"})[0]));
  EXPECT_TRUE(m.is_accepting());
  EXPECT_FALSE(m.accept(ids_of({"c"})[0]));
  EXPECT_TRUE(m.accept(eos));
  EXPECT_TRUE(m.is_terminated());
  m.rollback(2);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_TRUE(m.accept(ids_of({"d"})[0]));
  EXPECT_TRUE(m.is_accepting());
  EXPECT_THROW(m.rollback(5), GrammarError);
  m.rollback(2);
  EXPECT_EQ(m.steps(), 0u);
  EXPECT_EQ(m.forced_bytes(), "ab");
}

TEST(GrammarMatcher, ForcedBytesFollowTheSchema) {
  auto g = std::make_shared<CompiledGrammar>(
      compile_json_schema_text(R"({"type":"object","properties":{"name":{"const":"x"}},"required":["name"]})"), index());
  Matcher m(g);
  EXPECT_EQ(m.forced_bytes(), "{\"name\":\"x\"");  // additional properties may follow
}

}  // namespace matcher_test
}  // namespace exl
