// Speculative decoding by prompt lookup: the drafts it proposes, and that a job emits exactly the
// tokens it emits without speculation (greedy and sampled, under a grammar, batched with other
// jobs) while actually accepting drafts, on stories260K with the CPU backend.
#include "engine/generate/speculation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "engine/generate/draft_model.h"
#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "speculation_identity.h"
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

TEST(NgramDraft, MatchesByClassWhenGiven) {
  // Token 10 is " Ghent", 11 is "Ghent" (class 11 for both); the document said " Ghent" then 4, 5.
  std::vector<int32_t> classes(12);
  std::iota(classes.begin(), classes.end(), 0);
  classes[10] = 11;
  const std::vector<int32_t> t{1, 10, 4, 5, 2, 11};
  EXPECT_TRUE(ngram_draft(t, 3, 3, 1).empty()) << "by id, 11 never occurred before";
  EXPECT_EQ(ngram_draft(t, 3, 3, 1, classes), (std::vector<int32_t>{4, 5, 2}));
}

TEST(LookupClasses, AWordWithALeadingSpaceJoinsTheWordWithout) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  const auto tok = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  const std::vector<int32_t> classes = lookup_classes(*tok);
  ASSERT_EQ(classes.size(), size_t(tok->vocab_size()));
  auto id_of = [&](std::string_view bytes) {
    for (int32_t t = 0; t < tok->vocab_size(); ++t)
      if (!tok->is_special(t) && tok->token_bytes(t) == bytes) return t;
    return int32_t(-1);
  };
  int pairs = 0;
  for (const char* w : {"the", "was", "he", "on", "in"}) {
    const int32_t spaced = id_of(std::string(" ") + w), bare = id_of(w);
    if (spaced < 0 || bare < 0) continue;
    ++pairs;
    EXPECT_EQ(classes[size_t(spaced)], bare) << w;
    EXPECT_EQ(classes[size_t(bare)], bare) << w;
  }
  EXPECT_GT(pairs, 0) << "the vocabulary has some word both with and without a leading space";
  const int32_t space = id_of(" ");
  if (space >= 0) {
    EXPECT_EQ(classes[size_t(space)], space) << "a lone space stays itself";
  }
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
  for (Speculation s : {Speculation::none, Speculation::ngram, Speculation::draft, Speculation::auto_})
    EXPECT_EQ(parse_speculation(to_string(s)), s);
  EXPECT_FALSE(parse_speculation("medusa").has_value());
  EXPECT_FALSE(parse_speculation("Draft").has_value());
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

// The sampled tokens' distribution with prompt lookup is the one without: 300 jobs per mode at
// temperature 1, on disjoint seeds (so that this is a two-sample test, not the per-seed identity
// above), compared position by position with Pearson's chi-square test of homogeneity at
// p = 0.001 (categories with fewer than 5 expected draws in either mode pooled; critical values
// by Wilson–Hilferty). The jobs do draft and accept.
TEST(Speculation, SampledTokenDistributionsMatchWithoutSpeculation) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  constexpr int kJobs = 300, kPositions = 6;
  std::vector<std::map<int32_t, int>> counts[2];
  int64_t drafted = 0, accepted = 0;
  for (int mode = 0; mode < 2; ++mode) {
    counts[mode].resize(kPositions);
    Generator g(*s.model, *s.tok, {});
    for (int i = 0; i < kJobs; ++i) {
      Outcome r;
      GenerationJob j = s.job(k_story, mode ? Speculation::ngram : Speculation::none, &r, 1.0f, kPositions);
      j.sampling.seed = uint64_t(1000 + mode * kJobs + i);
      g.submit(std::move(j));
      g.run_until_idle();
      ASSERT_TRUE(r.done) << r.error;
      for (int p = 0; p < kPositions && p < int(r.tokens.size()); ++p) ++counts[mode][size_t(p)][r.tokens[size_t(p)]];
      if (mode) drafted += r.stats.n_drafted, accepted += r.stats.n_accepted;
    }
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  for (int p = 0; p < kPositions; ++p) {
    std::map<int32_t, std::pair<int, int>> table;  // token → (count without, count with)
    int n0 = 0, n1 = 0;
    for (const auto& [t, c] : counts[0][size_t(p)]) table[t].first = c, n0 += c;
    for (const auto& [t, c] : counts[1][size_t(p)]) table[t].second = c, n1 += c;
    ASSERT_GT(n0, 0);
    ASSERT_GT(n1, 0);
    std::vector<std::pair<double, double>> cells;  // (observed without, observed with), rare ones pooled
    std::pair<double, double> pooled{0, 0};
    for (const auto& [t, c] : table) {
      const double total = c.first + c.second;
      if (total * std::min(n0, n1) / double(n0 + n1) < 5) pooled.first += c.first, pooled.second += c.second;
      else cells.emplace_back(c.first, c.second);
    }
    if (pooled.first + pooled.second > 0) cells.push_back(pooled);
    if (cells.size() < 2) continue;  // one outcome in both modes: nothing to compare
    double chi2 = 0;
    for (const auto& [a, b] : cells) {
      const double total = a + b, e0 = total * n0 / double(n0 + n1), e1 = total * n1 / double(n0 + n1);
      chi2 += (a - e0) * (a - e0) / e0 + (b - e1) * (b - e1) / e1;
    }
    const double df = double(cells.size() - 1), z = 3.0902;  // one-sided 0.999 normal quantile
    const double crit = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
    EXPECT_LT(chi2, crit) << "position " << p << ": " << cells.size() << " categories";
  }
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

// The grammar constraint without its drafting side: drafts go unchecked.
struct BlindDraftHook : LogitsMaskHook {
  std::shared_ptr<LogitsMaskHook> inner;
  explicit BlindDraftHook(std::shared_ptr<LogitsMaskHook> h) : inner(std::move(h)) {}
  void fill_mask(std::span<uint32_t> mask) override { inner->fill_mask(mask); }
  void accept(int32_t token) override { inner->accept(token); }
  std::vector<int32_t> forced_tokens(std::span<const int32_t> generated) override { return inner->forced_tokens(generated); }
  bool terminated() const override { return inner->terminated(); }
};

TEST(Speculation, DraftsWalkTheGrammarTakingItsForcedTokensAndDroppingIllegalGuesses) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  // The story says "a little girl named Lily" twice; the grammar wants "big" and other names, so
  // prompt lookup guesses tokens the grammar forbids, and the grammar forces the words between.
  const char* pattern = "( there was a big (dog|cat|boy) named [A-Z][a-z]{2,8}, and a (dog|cat|boy)\\.){3}";
  Outcome plain, walked, blind;
  GenerationJob a = s.job(k_story, Speculation::none, &plain, 0, 120);
  a.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
  GenerationJob b = s.job(k_story, Speculation::ngram, &walked, 0, 120);
  b.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
  GenerationJob c = s.job(k_story, Speculation::ngram, &blind, 0, 120);
  c.mask = std::make_shared<BlindDraftHook>(make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok));
  s.solo(std::move(a), &plain);
  s.solo(std::move(b), &walked);
  s.solo(std::move(c), &blind);
  ASSERT_TRUE(plain.done && walked.done && blind.done) << plain.error << walked.error << blind.error;
  EXPECT_EQ(plain.reason, FinishReason::stop_token) << "the grammar completes";
  EXPECT_EQ(walked.tokens, plain.tokens);
  EXPECT_EQ(blind.tokens, plain.tokens);
  const int64_t walked_rejected = walked.stats.n_drafted - walked.stats.n_accepted;
  const int64_t blind_rejected = blind.stats.n_drafted - blind.stats.n_accepted;
  EXPECT_LT(walked_rejected, blind_rejected) << "guesses the grammar forbids are never drafted";
  EXPECT_LT(walked.stats.n_decode_passes, blind.stats.n_decode_passes)
      << "forced tokens ride in the draft instead of waiting for the next pass";
  EXPECT_LT(walked.stats.n_decode_passes, plain.stats.n_decode_passes);
  std::printf("passes: plain %lld, blind %lld (drafted %lld, accepted %lld), walked %lld (drafted %lld, accepted %lld); tokens %lld\n",
              (long long)plain.stats.n_decode_passes, (long long)blind.stats.n_decode_passes,
              (long long)blind.stats.n_drafted, (long long)blind.stats.n_accepted,
              (long long)walked.stats.n_decode_passes, (long long)walked.stats.n_drafted,
              (long long)walked.stats.n_accepted, (long long)plain.stats.n_generated);
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
    if (max_seqs == 2) {
      EXPECT_EQ(drafted, 0) << "four jobs decode together";
    }
    else EXPECT_GT(drafted, 0);
  }
}

// A draft model drafting for its own model: under greedy decoding every guess is the target's
// choice, so all are accepted; a K/V slot fed out of step would show as rejections.
TEST(DraftModelSpeculation, ADraftOfTheSameModelIsAlwaysAcceptedUnderAGrammarToo) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  const char* pattern = "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){3}";
  GeneratorOptions go;
  go.draft_model = s.model.get();
  for (bool grammar : {false, true}) {
    Outcome plain, drafted;
    GenerationJob a = s.job(k_story, Speculation::none, &plain, 0, 100);
    GenerationJob b = s.job(k_story, Speculation::draft, &drafted, 0, 100);
    if (grammar) {
      a.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
      b.mask = make_grammar_constraint(compile_regex_for(pattern, *s.tok), *s.tok);
    }
    s.solo(std::move(a), &plain);
    Generator g(*s.model, *s.tok, go);
    g.submit(std::move(b));
    g.run_until_idle();
    ASSERT_TRUE(plain.done && drafted.done) << drafted.error;
    EXPECT_EQ(drafted.tokens, plain.tokens) << grammar;
    EXPECT_EQ(drafted.reason, plain.reason);
    EXPECT_GT(drafted.stats.n_drafted, 10) << grammar;
    EXPECT_EQ(drafted.stats.n_accepted, drafted.stats.n_drafted) << grammar;
    EXPECT_LT(drafted.stats.n_decode_passes * 2, drafted.stats.n_generated) << grammar;
  }
}

TEST(Speculation, GreedyTokensAreTheSameOnTheDemoAndExl2RefModels) {
  test::expect_speculation_keeps_greedy_tokens([] { return make_cpu_backend(2); });
}

// A quantized copy drafting for the FP16 model (exl2-ref llama-gqa, random weights): the output
// is the target's, greedy and sampled, alone and batched with jobs that do not draft.
TEST(DraftModelSpeculation, AQuantizedDraftLeavesTheTargetsTokensUnchanged) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/output.safetensors");
  const auto root = test::shared_dir() / "data/exl2-ref/llama-gqa";
  auto be = make_cpu_backend(2);
  ModelDir tdir(root / "hf"), ddir(root / "exl2-4.0bpw");
  auto ttok = load_tokenizer(tdir.path()), dtok = load_tokenizer(ddir.path());
  check_same_vocabulary(*ttok, *dtok);
  Model target(tdir, *be), draft(ddir, *be);
  const auto ids = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"))["input_ids"];
  std::vector<int32_t> prompt;
  for (const auto& row : ids.is_array() && ids[0].is_array() ? ids[0] : ids) prompt.push_back(row.get<int32_t>());
  auto job = [&](Speculation sp, Outcome* r, float temperature) {
    GenerationJob j;
    j.prompt = prompt;
    j.sampling.temperature = temperature;
    j.sampling.seed = 5;
    j.max_new_tokens = 40;
    j.speculate = sp;
    j.on_event = [r](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) return r->tokens.push_back(e.token);
      r->stats = e.stats, r->reason = e.reason, r->error = e.error, r->done = true;
    };
    return j;
  };
  GeneratorOptions go;
  go.draft_model = &draft;
  for (float temperature : {0.0f, 0.8f}) {
    Outcome plain, alone, batched, other;
    {
      Generator g(target, *ttok, {});
      g.submit(job(Speculation::none, &plain, temperature));
      g.run_until_idle();
    }
    {
      Generator g(target, *ttok, go);
      g.submit(job(Speculation::draft, &alone, temperature));
      g.run_until_idle();
    }
    {
      Generator g(target, *ttok, go);
      g.submit(job(Speculation::none, &other, temperature));
      g.submit(job(Speculation::draft, &batched, temperature));
      g.run_until_idle();
    }
    ASSERT_TRUE(plain.done && alone.done && batched.done && other.done) << alone.error << batched.error;
    EXPECT_EQ(alone.tokens, plain.tokens) << temperature;
    EXPECT_EQ(batched.tokens, plain.tokens) << temperature;
    EXPECT_EQ(other.tokens, plain.tokens) << temperature;
    EXPECT_GT(alone.stats.n_drafted, 0);
    EXPECT_EQ(other.stats.n_drafted, 0);
    if (temperature == 0.0f) {
      EXPECT_GT(alone.stats.n_accepted, 0) << "the quantized copy agrees sometimes";
    }
  }
}

TEST(DraftModelSpeculation, DraftWithoutADraftModelIsAJobErrorAndVocabulariesAreChecked) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Stories s;
  Outcome r;
  s.solo(s.job("Once", Speculation::draft, &r), &r);
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.reason, FinishReason::error);
  EXPECT_NE(r.error.find("needs a draft model"), std::string::npos) << r.error;
  EXPECT_NO_THROW(check_same_vocabulary(*s.tok, *s.tok));
  EXL_REQUIRE_SHARED("models/llama2-tokenizer/tokenizer.model");
  const auto other = load_tokenizer(test::shared_dir() / "models/llama2-tokenizer");
  try {
    check_same_vocabulary(*s.tok, *other);
    ADD_FAILURE() << "different vocabularies accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace speculation_test
}  // namespace exl
