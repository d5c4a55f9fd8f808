#include "engine/generate/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "kernels/error.h"

namespace exl {
namespace sampler_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr float inf = std::numeric_limits<float>::infinity();

std::vector<float> log_of(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

SamplerSettings seeded(uint64_t seed = 7) {
  SamplerSettings s;
  s.seed = seed;
  return s;
}

std::vector<int32_t> tokens_of(const std::vector<Sampler::TokenProb>& d) {
  std::vector<int32_t> t;
  for (const auto& x : d) t.push_back(x.token);
  return t;
}

float prob_of(const std::vector<Sampler::TokenProb>& d, int32_t token) {
  for (const auto& x : d)
    if (x.token == token) return x.p;
  return -1.0f;
}

// Samples once from a fresh copy of `logits` and returns the final distribution.
std::vector<Sampler::TokenProb> distribution(const SamplerSettings& s, std::vector<float> logits) {
  Sampler sampler(s);
  sampler.sample(logits);
  return sampler.last_distribution();
}

std::vector<uint32_t> mask_allowing(size_t n, std::vector<int32_t> allowed) {
  std::vector<uint32_t> m(mask_words(n), 0);
  for (int32_t t : allowed) m[size_t(t) / 32] |= 1u << (t % 32);
  return m;
}

// p = {0.05, 0.4, 0.1, 0.25, 0.2}; descending order: 1 (.4), 3 (.25), 4 (.2), 2 (.1), 0 (.05).
const std::vector<double> kP = {0.05, 0.4, 0.1, 0.25, 0.2};

TEST(Sampler, GreedyPicksLowestIndexAmongEqualMaxima) {
  SamplerSettings s = seeded();
  s.temperature = 0.0f;
  Sampler sampler(s);
  std::vector<float> l = {1.0f, 3.0f, 3.0f, 2.0f, -inf};
  EXPECT_EQ(sampler.sample(l), 1);
  std::vector<float> l2 = {1.0f, 3.0f, 3.0f, 2.0f, -inf};
  EXPECT_EQ(sampler.sample(l2, mask_allowing(5, {0, 2, 3})), 2);
  ASSERT_EQ(sampler.last_distribution().size(), 1u);
  EXPECT_EQ(sampler.last_distribution()[0].token, 2);
}

TEST(Sampler, TemperatureScalesTheDistribution) {
  SamplerSettings s = seeded();
  s.temperature = 2.0f;
  auto d = distribution(s, log_of(kP));
  // p^(1/2) renormalized.
  double z = 0;
  for (double p : kP) z += std::sqrt(p);
  ASSERT_EQ(d.size(), 5u);
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(prob_of(d, t), std::sqrt(kP[size_t(t)]) / z, 1e-6) << t;
}

TEST(Sampler, TopKKeepsTheKLargest) {
  SamplerSettings s = seeded();
  s.top_k = 2;
  auto d = distribution(s, log_of(kP));
  EXPECT_THAT(tokens_of(d), UnorderedElementsAre(1, 3));
  EXPECT_NEAR(prob_of(d, 1), 0.4 / 0.65, 1e-6);
  EXPECT_NEAR(prob_of(d, 3), 0.25 / 0.65, 1e-6);
  s.top_k = 5;  // k >= n keeps everything
  EXPECT_EQ(distribution(s, log_of(kP)).size(), 5u);
  // Ties at the cut are broken by the lower id.
  s.top_k = 2;
  EXPECT_THAT(tokens_of(distribution(s, {1.0f, 2.0f, 1.0f, 1.0f})), UnorderedElementsAre(1, 0));
}

TEST(Sampler, TopPKeepsTheShortestPrefixReachingP) {
  SamplerSettings s = seeded();
  s.top_p = 0.6f;  // .4 < .6, .4 + .25 = .65 >= .6
  auto d = distribution(s, log_of(kP));
  EXPECT_THAT(tokens_of(d), ElementsAre(1, 3));
  EXPECT_NEAR(prob_of(d, 3), 0.25 / 0.65, 1e-6);
  s.top_p = 0.7f;  // .65 < .7, + .2 = .85
  EXPECT_THAT(tokens_of(distribution(s, log_of(kP))), ElementsAre(1, 3, 4));
  s.top_p = 0.3f;  // the first token alone crosses
  EXPECT_THAT(tokens_of(distribution(s, log_of(kP))), ElementsAre(1));
}

TEST(Sampler, TopPOnALargeVocabularyExtendsTheSortedPrefix) {
  // 1000 tokens of equal probability: top_p 0.5 needs 500 of them (beyond the first 64 sorted),
  // ties ordered by id.
  SamplerSettings s = seeded();
  s.top_p = 0.5f;
  std::vector<float> l(1000, 0.0f);
  auto d = distribution(s, l);
  ASSERT_GE(d.size(), 499u);
  ASSERT_LE(d.size(), 501u);
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i].token, int32_t(i));
}

TEST(Sampler, MinPKeepsTokensAboveAFractionOfTheMax) {
  SamplerSettings s = seeded();
  s.min_p = 0.3f;  // threshold .12: drops .1 and .05
  EXPECT_THAT(tokens_of(distribution(s, log_of(kP))), UnorderedElementsAre(1, 3, 4));
  s.min_p = 0.55f;  // threshold .22
  auto d = distribution(s, log_of(kP));
  EXPECT_THAT(tokens_of(d), UnorderedElementsAre(1, 3));
  EXPECT_NEAR(prob_of(d, 1), 0.4 / 0.65, 1e-6);
}

TEST(Sampler, TypicalKeepsTokensClosestToTheEntropy) {
  // H = 1.415023; |-ln p - H| = {1.5807, 0.4987, 0.8876, 0.0287, 0.1944} -> order 3, 4, 1, 2, 0
  // with masses .25, .45, .85, ...
  SamplerSettings s = seeded();
  s.typical_p = 0.4f;
  EXPECT_THAT(tokens_of(distribution(s, log_of(kP))), ElementsAre(3, 4));
  s.typical_p = 0.5f;
  auto d = distribution(s, log_of(kP));
  EXPECT_THAT(tokens_of(d), ElementsAre(3, 4, 1));
  EXPECT_NEAR(prob_of(d, 4), 0.2 / 0.85, 1e-6);
}

TEST(Sampler, FiltersComposeInDocumentedOrder) {
  // top_k 4 -> {1,3,4,2} renormalized over .95; top_p .5: .4/.95 = .421 < .5, + .25/.95 -> {1,3};
  // min_p .7 of the renormalized max: .25/.4 = .625 < .7 -> {1}.
  SamplerSettings s = seeded();
  s.top_k = 4;
  s.top_p = 0.5f;
  EXPECT_THAT(tokens_of(distribution(s, log_of(kP))), ElementsAre(1, 3));
  s.min_p = 0.7f;
  auto d = distribution(s, log_of(kP));
  EXPECT_THAT(tokens_of(d), ElementsAre(1));
  EXPECT_FLOAT_EQ(d[0].p, 1.0f);
}

TEST(Sampler, PenaltiesFollowCtrlAndOpenAiFormulas) {
  SamplerSettings s = seeded();
  s.temperature = 0.0f;
  s.repetition_penalty = 2.0f;
  s.frequency_penalty = 0.5f;
  s.presence_penalty = 0.25f;
  s.penalty_last_n = -1;
  Sampler sampler(s);
  sampler.accept(std::vector<int32_t>{0, 1, 0});
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  EXPECT_EQ(sampler.sample(l), 3);
  // token 0 (2x): 2/2 - (2*.5 + .25) = -.25; token 1 (1x): -1*2 - (.5 + .25) = -2.75.
  EXPECT_THAT(l, ElementsAre(-0.25f, -2.75f, 0.5f, 3.0f));

  s.penalty_last_n = 1;  // only the last history token (0, once): 2/2 - .75 = .25
  Sampler windowed(s);
  windowed.accept(std::vector<int32_t>{0, 1, 0});
  std::vector<float> l2 = {2.0f, -1.0f, 0.5f, 3.0f};
  windowed.sample(l2);
  EXPECT_THAT(l2, ElementsAre(0.25f, -1.0f, 0.5f, 3.0f));

  windowed.rollback(1);  // history {0, 1}: the window now holds token 1 -> -1*2 - .75
  std::vector<float> l3 = {2.0f, -1.0f, 0.5f, 3.0f};
  windowed.sample(l3);
  EXPECT_THAT(l3, ElementsAre(2.0f, -2.75f, 0.5f, 3.0f));
  EXPECT_THROW(windowed.rollback(3), Error);
}

TEST(Sampler, PenaltiesCanChangeTheGreedyChoice) {
  SamplerSettings s = seeded();
  s.temperature = 0.0f;
  s.repetition_penalty = 1.5f;
  Sampler sampler(s);
  sampler.accept(2);
  std::vector<float> l = {0.0f, 1.0f, 1.2f};  // 1.2 / 1.5 = 0.8 < 1
  EXPECT_EQ(sampler.sample(l), 1);
}

TEST(Sampler, LogitBiasIsAddedBeforeEverythingElse) {
  SamplerSettings s = seeded();
  s.temperature = 0.0f;
  s.logit_bias = {{2, 5.0f}};
  Sampler sampler(s);
  std::vector<float> l = {1.0f, 4.0f, 0.0f};
  EXPECT_EQ(sampler.sample(l), 2);
  EXPECT_FLOAT_EQ(l[2], 5.0f);

  SamplerSettings ban = seeded();
  ban.logit_bias = {{1, -inf}};
  Sampler banned(ban);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> x = {0.0f, 10.0f, 0.0f};
    EXPECT_NE(banned.sample(x), 1);
  }
  // Bias cannot re-enable a masked token.
  SamplerSettings up = seeded();
  up.temperature = 0.0f;
  up.logit_bias = {{0, 100.0f}};
  Sampler masked(up);
  std::vector<float> y = {0.0f, 1.0f, 0.5f};
  EXPECT_EQ(masked.sample(y, mask_allowing(3, {1, 2})), 1);
}

TEST(Sampler, MaskRestrictsSampling) {
  Sampler sampler(seeded());
  const auto mask = mask_allowing(70, {3, 40, 69});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 300; ++i) {
    std::vector<float> l(70, 0.0f);
    l[5] = 20.0f;  // the most likely token is masked out
    ++seen[sampler.sample(l, mask)];
  }
  std::vector<int32_t> keys;
  for (auto& [k, v] : seen) keys.push_back(k);
  EXPECT_THAT(keys, ElementsAre(3, 40, 69));
}

TEST(Sampler, NothingAllowedIsAnErrorNotACrash) {
  for (SamplerMode mode : {SamplerMode::default_, SamplerMode::llama2c}) {
    for (float temp : {0.0f, 1.0f}) {
      SamplerSettings s = seeded();
      s.mode = mode;
      s.temperature = temp;
      Sampler sampler(s);
      std::vector<float> l(40, 1.0f);
      std::vector<uint32_t> none(2, 0);
      try {
        sampler.sample(l, none);
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("engine: sampler: no token can be sampled"));
      }
      std::vector<float> all_neg_inf(4, -inf);
      EXPECT_THROW(sampler.sample(all_neg_inf), Error);
    }
  }
}

TEST(Sampler, BadInputsThrowNamedErrors) {
  Sampler sampler(seeded());
  std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_THROW(sampler.sample(nan), Error);
  std::vector<float> pos_inf = {0.0f, inf};
  EXPECT_THROW(sampler.sample(pos_inf), Error);
  std::vector<float> empty;
  EXPECT_THROW(sampler.sample(empty), Error);
  std::vector<float> l(33, 0.0f);
  std::vector<uint32_t> short_mask(1, ~0u);
  EXPECT_THROW(sampler.sample(l, short_mask), Error);
  EXPECT_THROW(sampler.accept(-1), Error);

  SamplerSettings s;
  s.temperature = -1.0f;
  EXPECT_THROW(Sampler{s}, Error);
  s = {};
  s.top_p = 1.5f;
  EXPECT_THROW(Sampler{s}, Error);
  s = {};
  s.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{s}, Error);
  s = {};
  s.logit_bias = {{7, 1.0f}};
  EXPECT_THROW(validate(s, 5), Error);
  Sampler bias_out_of_range(s);
  std::vector<float> five(5, 0.0f);
  EXPECT_THROW(bias_out_of_range.sample(five), Error);
  s = {};
  s.mode = SamplerMode::llama2c;
  s.top_k = 40;
  try {
    Sampler bad(s);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("llama2c mode"));
  }
  SamplerSettings pen = seeded();
  pen.presence_penalty = 1.0f;
  Sampler p(pen);
  p.accept(9);
  EXPECT_THROW(p.sample(five), Error);
  EXPECT_EQ(parse_sampler_mode("llama2c"), SamplerMode::llama2c);
  EXPECT_THROW(parse_sampler_mode("greedy"), Error);
}

TEST(Sampler, SeededRunsAreReproducible) {
  auto run = [](uint64_t seed) {
    SamplerSettings s = seeded(seed);
    s.top_p = 0.95f;
    Sampler sampler(s);
    std::vector<int32_t> out;
    for (int i = 0; i < 500; ++i) {
      std::vector<float> l(50);
      for (size_t j = 0; j < l.size(); ++j) l[j] = float(std::sin(double(j) * 1.7 + i));
      out.push_back(sampler.sample(l));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  SamplerSettings unseeded;
  Sampler a(unseeded);
  SamplerSettings reseeded = seeded(a.seed());
  Sampler b(reseeded);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> la(20, 0.0f), lb(20, 0.0f);
    EXPECT_EQ(a.sample(la), b.sample(lb));
  }
}

TEST(Sampler, FrequenciesMatchTheDistribution) {
  // 100k draws from {.1, .2, .3, .4}: Pearson chi-square with 3 degrees of freedom must stay
  // below 16.27 (the 0.1% critical value). The seed is fixed, so this is deterministic.
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  Sampler sampler(seeded(2024));
  std::vector<int> counts(4, 0);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    auto l = log_of(p);
    ++counts[size_t(sampler.sample(l))];
  }
  double chi2 = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double e = p[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);
  // And a biased sampler (always token 0) must fail the same bound: the check has teeth.
  double chi2_bad = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double e = p[i] * n, c = i == 0 ? n : 0;
    chi2_bad += (c - e) * (c - e) / e;
  }
  EXPECT_GT(chi2_bad, 16.27);
}

TEST(Llama2cRng, FirstValuesMatchRunC) {
  // Independently computed with python3 from the run.c formulas:
  //   s ^= s >> 12; s ^= (s << 25) mod 2^64; s ^= s >> 27; u32 = (s * 0x2545F4914F6CDD1D mod 2^64) >> 32
  // for seed 133742.
  Llama2cRng rng{133742};
  EXPECT_EQ(rng.next_u32(), 3033531262u);
  EXPECT_EQ(rng.next_u32(), 2674377904u);
  EXPECT_EQ(rng.next_u32(), 2312864567u);
  EXPECT_EQ(rng.next_u32(), 2287415643u);
  EXPECT_EQ(rng.next_u32(), 1408443089u);
  Llama2cRng f{133742};
  EXPECT_EQ(f.next_f32(), 0.7062990069389343f);  // (3033531262 >> 8) / 2^24
  EXPECT_EQ(f.next_f32(), 0.6226770877838135f);
}

TEST(Xoshiro256, FirstValuesMatchTheReferenceAlgorithm) {
  // Independently computed with python3: state = four splitmix64 outputs of seed 42, then
  // xoshiro256** (result = rotl(s1 * 5, 7) * 9).
  Xoshiro256 rng(42);
  EXPECT_EQ(rng.next(), 0x15780b2e0c2ec716ull);
  EXPECT_EQ(rng.next(), 0x6104d9866d113a7eull);
  EXPECT_EQ(rng.next(), 0xae17533239e499a1ull);
}

TEST(Sampler, Llama2cModeFollowsRunCSampleTopp) {
  // p = {.05, .5, .2, .25}, top_p .7: cutoff (1 - .7) / 3 = .1 keeps {1, 3, 2}; sorted .5, .25,
  // .2; the cumulative sum first exceeds .7 at .75 (tokens 1, 3). coin 1 = .7063: r = .5297 ->
  // cdf .5, .75 -> token 3. coin 2 = .6227: r = .4670 < .5 -> token 1.
  SamplerSettings s;
  s.mode = SamplerMode::llama2c;
  s.seed = 133742;
  s.top_p = 0.7f;
  Sampler sampler(s);
  const std::vector<double> p = {0.05, 0.5, 0.2, 0.25};
  auto l = log_of(p);
  EXPECT_EQ(sampler.sample(l), 3);
  EXPECT_NEAR(l[2], 0.2f, 1e-6f);  // logits now hold the softmax probabilities
  auto l2 = log_of(p);
  EXPECT_EQ(sampler.sample(l2), 1);
  EXPECT_TRUE(sampler.last_distribution().empty());

  // top_p 1 (or 0): plain inverse-CDF in index order. coin .7063: cdf .05, .55, .75 -> token 2;
  // coin .6227 -> token 2; coin .5385 -> token 1.
  s.top_p = 1.0f;
  Sampler plain(s);
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto x = log_of(p);
    got.push_back(plain.sample(x));
  }
  EXPECT_THAT(got, ElementsAre(2, 2, 1));

  // Temperature 0 is argmax and draws no coin: the next sample still sees coin 1.
  s.top_p = 0.0f;
  s.temperature = 0.0f;
  Sampler greedy(s);
  auto g = log_of(p);
  EXPECT_EQ(greedy.sample(g), 1);
}

TEST(Sampler, Llama2cTemperatureDividesBeforeTheSoftmax) {
  // T = 0.5 squares the ratios: p ∝ {.05², .5², .2², .25²} = {.0025, .25, .04, .0625} / .355;
  // coin .7063 with plain sampling: cdf .0070, .7113 -> token 1.
  SamplerSettings s;
  s.mode = SamplerMode::llama2c;
  s.seed = 133742;
  s.temperature = 0.5f;
  Sampler sampler(s);
  auto l = log_of({0.05, 0.5, 0.2, 0.25});
  EXPECT_EQ(sampler.sample(l), 1);
  EXPECT_NEAR(l[1], 0.25 / 0.355, 1e-6);
  EXPECT_NEAR(l[3], 0.0625 / 0.355, 1e-6);
}

TEST(Sampler, Llama2cSeedZeroMeansRandomLikeRunC) {
  SamplerSettings s;
  s.mode = SamplerMode::llama2c;
  s.seed = 0;
  Sampler sampler(s);
  EXPECT_NE(sampler.seed(), 0u);
}

}  // namespace sampler_test
}  // namespace exl
