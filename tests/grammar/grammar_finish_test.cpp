// What GrammarBuilder::finish does beyond determinizing (issue #25: bounded compile and mask
// time): equal rules merged, byte-only alternatives unioned, each checked against RE2 on random
// inputs; any-order object layouts that stay small; the matcher's tables that grow without a
// one-shot rebuild (node ids, the vocabulary's position-mask cache); partly sliced positions.
#include <gtest/gtest.h>
#include <re2/re2.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/token_index.h"
#include "grammar_test_util.h"

namespace exl {
namespace grammar_finish_test {

std::string random_text(std::mt19937& rng, std::string_view alphabet, size_t max_len) {
  std::string s(rng() % (max_len + 1), ' ');
  for (char& c : s) c = alphabet[rng() % alphabet.size()];
  return s;
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

bool is_forwarder_to(const Rule& r, int32_t target) {
  return r.states.size() == 2 && r.states[0].calls.size() == 1 && r.states[0].calls[0].callee == target &&
         !r.states[0].has_bytes;
}

TEST(GrammarFinish, EqualRulesAreMergedAndKeepTheirLanguage) {
  GrammarBuilder gb;
  int32_t root = gb.add_rule("root");
  int32_t c1 = gb.add_rule("c1"), c2 = gb.add_rule("c2"), d = gb.add_rule("d");
  gb.frags(c1).set_root(gb.frags(c1).literal("c"));
  gb.frags(c2).set_root(gb.frags(c2).literal("c"));
  gb.frags(d).set_root(gb.frags(d).literal("d"));
  // a and b differ only in which of two equal callees they call; e calls a different one
  int32_t a = gb.add_rule("a"), b = gb.add_rule("b"), e = gb.add_rule("e");
  gb.frags(a).set_root(gb.frags(a).seq({gb.frags(a).literal("ab"), gb.frags(a).call(c1)}));
  gb.frags(b).set_root(gb.frags(b).seq({gb.frags(b).literal("ab"), gb.frags(b).call(c2)}));
  gb.frags(e).set_root(gb.frags(e).seq({gb.frags(e).literal("ab"), gb.frags(e).call(d)}));
  // two equal recursive rules (balanced parentheses) stay apart
  int32_t p = gb.add_rule("p"), q = gb.add_rule("q");
  for (int32_t r : {p, q}) {
    FragBuilder f = gb.frags(r);
    f.set_root(f.seq({f.literal("("), f.opt(f.call(r)), f.literal(")")}));
  }
  FragBuilder f = gb.frags(root);
  f.set_root(f.alt({f.call(a), f.call(b), f.call(e), f.seq({f.literal("x"), f.call(p)}), f.seq({f.literal("y"), f.call(q)})}));
  Grammar g = gb.finish(root);
  EXPECT_TRUE(is_forwarder_to(g.rules[size_t(c2)], c1));
  EXPECT_TRUE(is_forwarder_to(g.rules[size_t(b)], a));
  EXPECT_FALSE(is_forwarder_to(g.rules[size_t(e)], a));
  EXPECT_FALSE(is_forwarder_to(g.rules[size_t(q)], p));
  for (const Rule& r : g.rules)
    for (const DfaState& st : r.states)
      for (const CallEdge& c : st.calls) {
        EXPECT_NE(c.callee, b) << "a call of a merged copy in " << r.name;
        EXPECT_NE(c.callee, c2) << "a call of a merged copy in " << r.name;
      }
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), nullptr);
  RE2 ref(R"(ab[cd]|[xy]\((\((\(\))?\))?\))");  // depth 3 at most below
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string s = random_text(rng, "abcdxy()", 8);
    bool balanced_depth_ok = true;
    int depth = 0;
    for (char ch : s) depth += ch == '(' ? 1 : ch == ')' ? -1 : 0, balanced_depth_ok &= depth <= 3;
    if (!balanced_depth_ok) continue;
    ASSERT_EQ(accepts(cg, s), RE2::FullMatch(s, ref)) << "'" << s << "'";
  }
}

TEST(GrammarFinish, ByteOnlyAlternativesBecomeOneUnion) {
  GrammarBuilder gb;
  int32_t root = gb.add_rule("root");
  std::vector<Frag> alts;
  for (const char* pattern : {"ab", "ba", "b{2}", "^c"}) {
    int32_t x = gb.add_rule(std::string("pattern ") + pattern);
    gb.frags(x).set_root(emit_regex(gb, x, pattern, {.search = true, .byte_only = true}));
    int32_t w = gb.add_rule(std::string("branch ") + pattern);  // a branch that only calls (a forwarder)
    gb.frags(w).set_root(gb.frags(w).call(x));
    alts.push_back(gb.frags(root).call(w));
  }
  FragBuilder f = gb.frags(root);
  f.set_root(f.seq({f.alt(alts), f.literal("!")}));
  Grammar g = gb.finish(root);
  ASSERT_EQ(g.rules[size_t(g.root)].states[0].calls.size(), 1u) << "the four branches stay separate calls";
  const Rule& u = g.rules[size_t(g.rules[size_t(g.root)].states[0].calls[0].callee)];
  for (const DfaState& st : u.states) EXPECT_TRUE(st.calls.empty());
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), nullptr);
  RE2 ref(R"((?:.*(?:ab|ba|bb).*|c.*)!)");
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string s = random_text(rng, "abc!", 9);
    ASSERT_EQ(accepts(cg, s), RE2::FullMatch(s, ref)) << "'" << s << "'";
  }
}

// The MaskBench case that needed this (Github_easy o65510): a oneOf of overlapping search
// patterns, each branch a product automaton excluding the others.
TEST(GrammarFinish, OneOfSearchPatternsStayExact) {
  Grammar g = compile_json_schema_text(
      R"({"type":"string","oneOf":[{"pattern":"ab"},{"pattern":"ba"},{"pattern":"ca"}]})");
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), nullptr);
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string body = random_text(rng, "abc", 7);
    int n = RE2::PartialMatch(body, "ab") + RE2::PartialMatch(body, "ba") + RE2::PartialMatch(body, "ca");
    ASSERT_EQ(accepts(cg, "\"" + body + "\""), n == 1) << body;
  }
}

// Ten tracked properties in any order (calculate_area_f5e0f7db's shape): the layout's members
// share one separator per state, so its automaton has a few states per set of written properties
// (7,182 for this object before, a copy of the separator per member and state).
TEST(GrammarFinish, AnyOrderLayoutsStaySmallAndExact) {
  std::string schema = R"({"type":"object","required":["a","b","c","d","e"],
    "properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"},"d":{"type":"integer"},
                  "e":{"type":"integer"},"f":{"type":"integer"},"g":{"type":"integer"},"h":{"type":"integer"},
                  "i":{"type":"integer"},"j":{"type":"integer"}},
    "dependentRequired":{"f":["g","h"],"i":["j"]}})";
  Grammar g = compile_json_schema_text(schema, test::any_order());
  size_t largest = 0;
  for (const Rule& r : g.rules) largest = std::max(largest, r.states.size());
  EXPECT_LT(largest, 3u * 1024u);
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), nullptr);
  EXPECT_TRUE(accepts(cg, R"({"e":1,"d":2,"c":3,"b":4,"a":5})"));
  EXPECT_TRUE(accepts(cg, R"({"e":1,"a":5,"i":0,"j":1,"d":2,"c":3,"b":4})"));
  EXPECT_TRUE(accepts(cg, R"({"h":1,"e":1,"f":0,"d":2,"g":1,"c":3,"b":4,"a":5})"));
  EXPECT_FALSE(accepts(cg, R"({"e":1,"d":2,"c":3,"b":4})"));                  // a missing
  EXPECT_FALSE(accepts(cg, R"({"e":1,"d":2,"c":3,"b":4,"a":5,"i":1})"));      // i without j
  EXPECT_FALSE(accepts(cg, R"({"e":1,"d":2,"c":3,"b":4,"a":5,"f":1,"g":1})")); // f without h
  EXPECT_FALSE(accepts(cg, R"({"e":1,"d":2,"c":3,"b":4,"a":5,"a":5})"));      // a twice
  EXPECT_FALSE(accepts(cg, R"({"e":1,,"d":2,"c":3,"b":4,"a":5})"));
}

// Deep nesting makes tens of thousands of distinct stacks, so the node-id table moves into
// larger successors several times while matching; every stack must still be found.
TEST(GrammarFinish, NodeIdsSurviveTableGrowth) {
  Grammar g = compile_json_schema_text(
      R"({"$defs":{"n":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},"$ref":"#/$defs/n"})");
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), nullptr);
  std::string deep;
  for (int i = 0; i < 3000; ++i) deep += "[";
  std::string closed = deep;
  for (int i = 0; i < 3000; ++i) closed += "]";
  EXPECT_TRUE(accepts(cg, closed));
  EXPECT_FALSE(accepts(cg, closed.substr(0, closed.size() - 1)));
  std::string pairs = deep + "[],[]";
  for (int i = 0; i < 3000; ++i) pairs += "]";
  EXPECT_TRUE(accepts(cg, pairs));
  EXPECT_FALSE(accepts(cg, deep + "[],[],[]" + std::string(3000, ']')));
  Matcher m(cg);  // the same grammar again: the stacks interned above are found, not duplicated
  EXPECT_TRUE(m.accept_bytes(closed));
  EXPECT_TRUE(m.is_accepting());
}

// The vocabulary-wide cache drops its oldest entries at its entry bound (it used to grow until
// its byte bound and then drop everything at once).
TEST(GrammarFinish, PositionMaskCacheEvictsOldestFirst) {
  TokenIndex ix({"a", "b"}, {});
  auto pm = std::make_shared<const PositionMask>();
  for (size_t i = 0; i <= TokenIndex::kMaskCacheEntries; ++i) ix.cache_mask(std::to_string(i), pm);
  EXPECT_EQ(ix.cached_mask("0"), nullptr);
  EXPECT_NE(ix.cached_mask("1"), nullptr);
  EXPECT_NE(ix.cached_mask(std::to_string(TokenIndex::kMaskCacheEntries)), nullptr);
}

// Strings without 14 'a's in a row: after k of them a position surely accepts the slice's
// members of up to 13 - k characters but not all longer ones, so its mask walks the trie of the
// rest and the longer members (TokenSlice::rest_longer) instead of the whole vocabulary. Masks
// must equal accepting each token, and with EXL_GRAMMAR_VERIFY every sliced position is checked
// against a full walk.
TEST(GrammarFinish, PartlySlicedPositionsKeepMasksExact) {
  setenv("EXL_GRAMMAR_VERIFY", "1", 1);
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, char(b)));
  for (size_t n : {2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 21}) vocab.push_back(std::string(n, 'a'));
  for (const char* t : {"ab", "ba", "aab", "a\"", "aa\"", "\"a", "bbbbbbbbbbbbbbbbbbbbbbbb", "\u00e9"}) vocab.push_back(t);
  vocab.push_back("<eos>");
  auto ix = std::make_shared<const TokenIndex>(vocab, std::vector<int32_t>{int32_t(vocab.size() - 1)});
  ASSERT_EQ(ix->slices()[0].rest_longer.size(), 3u);
  auto g = std::make_shared<const CompiledGrammar>(compile_json_schema_text(R"({"type":"string","not":{"pattern":"a{14}"}})"), ix);
  unsetenv("EXL_GRAMMAR_VERIFY");
  std::vector<int32_t> path{'"'};
  for (int i = 0; i < 13; ++i) path.push_back('a');
  path.push_back('b');
  path.push_back(int32_t(std::find(vocab.begin(), vocab.end(), std::string(12, 'a')) - vocab.begin()));
  path.push_back('"');
  Matcher m(g);
  std::vector<uint32_t> mask(ix->mask_words());
  for (size_t step = 0; step <= path.size(); ++step) {
    std::fill(mask.begin(), mask.end(), 0);
    m.fill_mask(mask);
    for (int32_t t = 0; t < int32_t(ix->vocab_size()); ++t) {
      Matcher copy = m;
      ASSERT_EQ(bool(mask[size_t(t) / 32] >> (t % 32) & 1), copy.accept(t)) << "step " << step << " token '" << vocab[size_t(t)] << "'";
    }
    if (step < path.size()) {
      ASSERT_TRUE(m.accept(path[step])) << "step " << step;
    }
  }
}

}  // namespace grammar_finish_test
}  // namespace exl
