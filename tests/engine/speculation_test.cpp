// Speculative decoding by prompt lookup: the drafts it proposes, and that a job emits exactly the
// tokens it emits without speculation (greedy and sampled, under a grammar, batched with other
// jobs) while actually accepting drafts, on stories260K with the CPU backend.
#include "engine/generate/speculation.h"

#include <gtest/gtest.h>

#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "test_support.h"

namespace exl {
namespace speculation_test {

TEST(NgramDraft, FollowsTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  const std::vector<int32_t> t{1, 2, 3, 9, 8, 1, 2, 3, 7, 5, 4, 1, 2, 3};
  EXPECT_EQ(ngram_draft(t, 2), (std::vector<int32_t>{7, 5}));
  EXPECT_EQ(ngram_draft(t, 10), (std::vector<int32_t>{7, 5, 4, 1, 2, 3}));
  // The 3-gram (4, 2, 3) never occurred; the 2-gram (2, 3) did, last before the end at 6.
  const std::vector<int32_t> u{2, 3, 6, 1, 2, 3, 8, 4, 2, 3};
  EXPECT_EQ(ngram_draft(u, 3), (std::vector<int32_t>{8, 4, 2}));
  EXPECT_EQ(ngram_draft(u, 3, 3, 3), std::vector<int32_t>{}) << "no 3-gram match and 2-grams not allowed";
}

TEST(NgramDraft, NothingWithoutARepeatOrRoom) {
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 5}, 4).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 1, 2}, 0).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{}, 4).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{7}, 4).empty());
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{5, 5, 5}, 4, 3, 1), (std::vector<int32_t>{5})) << "1-grams when allowed";
}

TEST(DraftLength, GrowsOnFullAcceptanceAndHalvesOnImmediateRejection) {
  DraftLength d;
  d.cur = 4, d.max = 6;
  d.update(4, 4);
  EXPECT_EQ(d.cur, 5);
  d.update(5, 5), d.update(6, 6);
  EXPECT_EQ(d.cur, 6);
  d.update(6, 3);
  EXPECT_EQ(d.cur, 6) << "a partly accepted draft keeps the length";
  d.update(6, 0), d.update(3, 0), d.update(1, 0);
  EXPECT_EQ(d.cur, 1);
  d.update(0, 0);
  EXPECT_EQ(d.cur, 1);
}

TEST(Speculation, ParsesItsNames) {
  for (Speculation s : {Speculation::none, Speculation::ngram, Speculation::auto_})
    EXPECT_EQ(parse_speculation(to_string(s)), s);
  EXPECT_FALSE(parse_speculation("draft").has_value());
}

struct Outcome {
  std::vector<int32_t> tokens;
  GenerationStats stats;
  FinishReason reason = FinishReason::error;
  std::string error;
  bool done = false;
};

struct Stories {
  ModelDir dir;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Model> model;
  Stories()
      : dir(test::shared_dir() / "models/stories260K-hf"),
        be(make_cpu_backend(2)),
        tok(load_tokenizer(dir.path())),
        model(std::make_unique<Model>(dir, *be)) {}

  GenerationJob job(const std::string& prompt, Speculation sp, Outcome* r, float temperature = 0, int n = 160) const {
    GenerationJob j;
    j.prompt = tok->encode(prompt, true);
    j.sampling.temperature = temperature;
    j.sampling.seed = 11;
    j.max_new_tokens = n;
    j.speculate = sp;
    j.on_event = [r](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) {
        r->tokens.push_back(e.token);
        return;
      }
      r->stats = e.stats;
      r->reason = e.reason;
      r->error = e.error;
      r->done = true;
    };
    return j;
  }
  Outcome solo(GenerationJob j, Outcome* r) {
    Generator g(*model, *tok, {});
    g.submit(std::move(j));
    g.run_until_idle();
    return *r;
  }
};

const char* const k_story =
    "Once upon a time, there was a little girl named Lily. She loved to play in the park. "
    "One day, Lily went to the park with her mom. Once upon a time, there was a little";

TEST(Speculation, GreedyTokensAreTheSameAndDraftsAreAccepted) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  for (const char* prompt : {k_story, "Once upon a time"}) {
    Outcome plain, spec;
    s.solo(s.job(prompt, Speculation::none, &plain), &plain);
    s.solo(s.job(prompt, Speculation::auto_, &spec), &spec);
    ASSERT_TRUE(plain.done && spec.done) << spec.error;
    EXPECT_EQ(spec.tokens, plain.tokens) << prompt;
    EXPECT_EQ(spec.reason, plain.reason);
    EXPECT_EQ(plain.stats.n_drafted, 0);
    EXPECT_EQ(plain.stats.n_decode_passes, plain.stats.n_generated);
    EXPECT_GT(spec.stats.n_accepted, 0) << prompt;
    EXPECT_LE(spec.stats.n_accepted, spec.stats.n_drafted);
    EXPECT_LT(spec.stats.n_decode_passes, spec.stats.n_generated) << "some passes emitted several tokens";
    EXPECT_EQ(spec.stats.n_generated, plain.stats.n_generated);
  }
}

TEST(Speculation, SampledTokensAreTheSameWithNgram) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  Outcome plain, spec, autod;
  s.solo(s.job(k_story, Speculation::none, &plain, 0.7f), &plain);
  s.solo(s.job(k_story, Speculation::ngram, &spec, 0.7f), &spec);
  s.solo(s.job(k_story, Speculation::auto_, &autod, 0.7f), &autod);
  ASSERT_TRUE(plain.done && spec.done && autod.done);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.n_drafted, 0);
  EXPECT_EQ(autod.stats.n_drafted, 0) << "auto does not speculate for sampled jobs";
  EXPECT_EQ(autod.tokens, plain.tokens);
}

TEST(Speculation, UnderAGrammarWithForcedStretchesTheTokensAreTheSame) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  const char* pattern = "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){3}";
  Outcome plain, spec;
  GenerationJob a = s.job(k_story, Speculation::none, &plain, 0, 120);
  a.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
  GenerationJob b = s.job(k_story, Speculation::ngram, &spec, 0, 120);
  b.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
  s.solo(std::move(a), &plain);
  s.solo(std::move(b), &spec);
  ASSERT_TRUE(plain.done && spec.done) << plain.error << spec.error;
  EXPECT_EQ(plain.reason, FinishReason::stop_token) << "the grammar completes";
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.reason, plain.reason);
  EXPECT_GT(spec.stats.n_accepted, 0);
}

TEST(Speculation, BatchedWithOtherJobsEachGetsItsSoloTokens) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  const std::vector<std::string> prompts{k_story, "Once upon a time", "Tom had a red ball. Tom had a red", "The"};
  std::vector<Outcome> solo(prompts.size()), batched(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) s.solo(s.job(prompts[i], Speculation::none, &solo[i], 0, 96), &solo[i]);
  Generator g(*s.model, *s.tok, {});
  for (size_t i = 0; i < prompts.size(); ++i)
    g.submit(s.job(prompts[i], i % 2 ? Speculation::ngram : Speculation::none, &batched[i], 0, 96));
  g.run_until_idle();
  int64_t accepted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(batched[i].done) << i;
    EXPECT_EQ(batched[i].tokens, solo[i].tokens) << prompts[i];
    accepted += batched[i].stats.n_accepted;
  }
  EXPECT_GT(accepted, 0);
}

TEST(Speculation, JobsThatWaitForPagesOrArePreemptedKeepTheirSoloTokens) {
  // Too few pages for four growing jobs: a draft is dropped when its pages run short, and the
  // youngest job gives its pages back and prefills again.
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  GeneratorOptions o;
  o.page_size = 8;
  o.num_pages = 16;
  o.max_batch_seqs = 4;
  const std::vector<std::string> prompts{k_story, "Tom had a red ball. Tom had a red", "Once upon a time", "The cat"};
  std::vector<Outcome> solo(prompts.size()), run(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Generator g(*s.model, *s.tok, o);
    g.submit(s.job(prompts[i], Speculation::none, &solo[i], 0, 40));
    g.run_until_idle();
    ASSERT_EQ(solo[i].reason, FinishReason::max_tokens) << solo[i].error;
  }
  Generator g(*s.model, *s.tok, o);
  for (size_t i = 0; i < prompts.size(); ++i) g.submit(s.job(prompts[i], Speculation::ngram, &run[i], 0, 40));
  g.run_until_idle();
  int64_t drafted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(run[i].reason, FinishReason::max_tokens) << i << ": " << run[i].error;
    EXPECT_EQ(run[i].tokens, solo[i].tokens) << prompts[i];
    drafted += run[i].stats.n_drafted;
  }
  EXPECT_GT(g.n_preempted(), 0);
  EXPECT_GT(drafted, 0);
}

TEST(Speculation, AutoDraftsOnlyWhileFewJobsDecode) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  for (int max_seqs : {2, 4}) {
    GeneratorOptions go;
    go.speculate = Speculation::auto_;
    go.speculate_max_seqs = max_seqs;
    Generator g(*s.model, *s.tok, go);
    std::vector<Outcome> out(4);
    for (auto& o : out) {
      GenerationJob j = s.job(k_story, Speculation::none, &o, 0, 48);
      j.speculate.reset();  // the generator's default
      g.submit(std::move(j));
    }
    g.run_until_idle();
    int64_t drafted = 0;
    for (const auto& o : out) drafted += o.stats.n_drafted;
    if (max_seqs == 2) EXPECT_EQ(drafted, 0) << "four jobs decode together";
    else EXPECT_GT(drafted, 0);
  }
}

}  // namespace speculation_test
}  // namespace exl
