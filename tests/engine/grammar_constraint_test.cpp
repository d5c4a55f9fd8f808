// Grammar-constrained generation on stories260K: outputs match the grammar and end by EOS,
// forced continuations are appended without sampling and tokenized canonically, a stuck grammar
// and a rejected token end the job with an error instead of hanging, batched seeds stay valid.
#include "engine/generate/grammar_constraint.h"

#include <gtest/gtest.h>

#include <regex>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "engine/formats/model_dir.h"
#include "kernels/error.h"
#include "generation_harness.h"
#include "test_support.h"

namespace exl {
namespace grammar_constraint_test {

using Result = test::GenerationRecord;
using Fixture = test::CpuModel;

GeneratorOptions small_cache() {
  GeneratorOptions o;
  o.num_pages = 32;
  return o;
}

Fixture& stories() {
  static Fixture f(test::shared_dir() / "models/stories260K-hf");
  return f;
}

GenerationJob job_for(Fixture& f, std::shared_ptr<LogitsMaskHook> hook, uint64_t seed, int max_tokens, Result* r) {
  GenerationJob j;
  j.prompt = f.tok->encode("Once upon a time", true);
  j.sampling.temperature = 1.0f;
  j.sampling.seed = seed;
  j.max_new_tokens = max_tokens;
  j.stop_tokens.assign(f.tok->eos_ids().begin(), f.tok->eos_ids().end());
  j.mask = std::move(hook);
  j.on_event = test::record_events(r);
  return j;
}

Result run_one(Fixture& f, std::shared_ptr<LogitsMaskHook> hook, uint64_t seed, int max_tokens,
               std::vector<int32_t> stop_tokens = {}, bool keep_stop_tokens = true) {
  Result r;
  Generator g(*f.model, *f.tok, small_cache());
  GenerationJob j = job_for(f, std::move(hook), seed, max_tokens, &r);
  if (!keep_stop_tokens) j.stop_tokens = std::move(stop_tokens);
  g.submit(std::move(j));
  g.run_until_idle();
  return r;
}

// Counts the calls the generator makes, passing them on to a real constraint.
struct CountingHook : LogitsMaskHook {
  std::shared_ptr<GrammarConstraint> inner;
  int masks = 0, forced_calls = 0;
  size_t forced = 0;
  void fill_mask(std::span<uint32_t> m) override {
    ++masks;
    inner->fill_mask(m);
  }
  void accept(int32_t t) override { inner->accept(t); }
  std::vector<int32_t> forced_tokens(std::span<const int32_t> g) override {
    ++forced_calls;
    auto v = inner->forced_tokens(g);
    forced += v.size();
    return v;
  }
  bool terminated() const override { return inner->terminated(); }
};

TEST(GrammarConstraint, RegexOutputsMatchAndEndByEos) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  auto g = compile_regex_for("(cat|dog|bird)s? [0-9]{1,3}", *f.tok);
  const std::regex re("(cat|dog|bird)s? [0-9]{1,3}");
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Result r = run_one(f, make_grammar_constraint(g, *f.tok), seed, 40);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.reason, FinishReason::stop_token) << r.error;
    EXPECT_TRUE(std::regex_match(r.text, re)) << "seed " << seed << ": '" << r.text << "'";
    EXPECT_EQ(r.stats.n_generated, int64_t(r.tokens.size()));
    EXPECT_EQ(f.tok->decode(r.tokens, true), r.text);
  }
}

TEST(GrammarConstraint, FullyForcedOutputIsNeverSampledAndCanonical) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  const std::string text = R"({"title":"The little red hen","done":true})";
  nlohmann::ordered_json schema = {{"const", nlohmann::ordered_json::parse(text)}};
  auto hook = std::make_shared<CountingHook>();
  hook->inner = make_grammar_constraint(compile_json_schema_for(schema, *f.tok), *f.tok);
  Result r = run_one(f, hook, 7, 200);
  EXPECT_EQ(r.reason, FinishReason::stop_token) << r.error;
  EXPECT_EQ(r.text, text);
  EXPECT_EQ(hook->masks, 0);  // every token, EOS included, was forced
  EXPECT_EQ(hook->forced, r.tokens.size());
  EXPECT_TRUE(f.tok->is_eos(r.tokens.back()));
  // Canonical: the tokens are the tokenizer's own encoding of the text (after a newline, which
  // keeps SentencePiece's dummy-prefix space out of it).
  std::vector<int32_t> ref = f.tok->encode("\n" + text, false);
  std::vector<int32_t> body(r.tokens.begin(), r.tokens.end() - 1);
  ASSERT_LT(body.size(), ref.size());
  EXPECT_EQ(body, std::vector<int32_t>(ref.end() - std::ptrdiff_t(body.size()), ref.end()));
  EXPECT_EQ(r.stats.n_generated, int64_t(r.tokens.size()));
}

TEST(GrammarConstraint, JsonSchemaOutputsValidateWithForcedKeys) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
    "type":"object","properties":{
      "name":{"type":"string","maxLength":8},
      "age":{"type":"integer","minimum":0,"maximum":120},
      "kind":{"enum":["cat","dog"]}},
    "required":["name","age","kind"],"additionalProperties":false})");
  auto g = compile_json_schema_for(schema, *f.tok);
  // Several seeds batched in one generator, sharing the compiled grammar.
  std::vector<Result> rs(6);
  std::vector<std::shared_ptr<CountingHook>> hooks;
  Generator gen(*f.model, *f.tok, small_cache());
  for (size_t i = 0; i < rs.size(); ++i) {
    auto h = std::make_shared<CountingHook>();
    h->inner = make_grammar_constraint(g, *f.tok);
    hooks.push_back(h);
    gen.submit(job_for(f, h, 100 + i, 60, &rs[i]));
  }
  gen.run_until_idle();
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    ASSERT_EQ(r.reason, FinishReason::stop_token) << "seed " << 100 + i << ": " << r.error << " '" << r.text << "'";
    auto j = nlohmann::ordered_json::parse(r.text);
    ASSERT_TRUE(j.is_object());
    ASSERT_EQ(j.size(), 3u);
    EXPECT_LE(j.at("name").get<std::string>().size(), 8u) << r.text;
    EXPECT_GE(j.at("age").get<int64_t>(), 0);
    EXPECT_LE(j.at("age").get<int64_t>(), 120);
    EXPECT_TRUE(j.at("kind") == "cat" || j.at("kind") == "dog");
    EXPECT_GT(hooks[i]->forced, 3u) << "the key names are forced";
    EXPECT_EQ(r.stats.n_generated, int64_t(r.tokens.size()));
  }
}

TEST(GrammarConstraint, TerminationEndsTheJobWithoutStopTokens) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  Result r = run_one(f, make_grammar_constraint(compile_regex_for("[a-z]{2,5}", *f.tok), *f.tok), 3, 50, {}, false);
  EXPECT_EQ(r.reason, FinishReason::stop_token) << r.error;
  EXPECT_TRUE(std::regex_match(r.text, std::regex("[a-z]{2,5}"))) << r.text;
}

struct StuckHook : LogitsMaskHook {
  void fill_mask(std::span<uint32_t>) override {}
  void accept(int32_t) override {}
};

struct BadForceHook : LogitsMaskHook {
  void fill_mask(std::span<uint32_t> m) override { m[0] |= 1u << 5; }
  void accept(int32_t t) override { EXL_CHECK(t == 5, "test hook: token ", t, " not allowed"); }
  std::vector<int32_t> forced_tokens(std::span<const int32_t>) override { return {9}; }
};

TEST(GrammarConstraint, StuckGrammarOrRejectedForcedTokenIsAnErrorNotAHang) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  Result stuck = run_one(f, std::make_shared<StuckHook>(), 1, 20);
  EXPECT_TRUE(stuck.done);
  EXPECT_EQ(stuck.reason, FinishReason::error);
  EXPECT_NE(stuck.error.find("allows no token"), std::string::npos) << stuck.error;
  Result bad = run_one(f, std::make_shared<BadForceHook>(), 1, 20);
  EXPECT_TRUE(bad.done);
  EXPECT_EQ(bad.reason, FinishReason::error);
  EXPECT_NE(bad.error.find("token 9 not allowed"), std::string::npos) << bad.error;
  EXPECT_EQ(bad.stats.n_generated, 0);
}

TEST(GrammarConstraint, MaxTokensCutsAnUnfinishedGrammar) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  Fixture& f = stories();
  Result r = run_one(f, make_grammar_constraint(compile_regex_for("[a-z ]{50,60}", *f.tok), *f.tok), 5, 4);
  EXPECT_EQ(r.reason, FinishReason::max_tokens);
  EXPECT_EQ(r.tokens.size(), 4u);
}

TEST(GrammarConstraint, TokenIndexIsSharedPerVocabulary) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto a = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  auto b = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  EXPECT_EQ(shared_token_index(*a), shared_token_index(*b));
  EXPECT_THROW(compile_json_schema_for(nlohmann::ordered_json::parse(R"({"$dynamicRef":"#meta"})"), *a), std::exception);
}

}  // namespace grammar_constraint_test
}  // namespace exl
