// The host side of sampling on the device (engine/generate/device_sampling.h): the inputs built from a
// job's Sampler give, through the reference of Backend::sample_rows, exactly the tokens that
// Sampler::sample gives on the same logits — the same RNG stream, penalties, biases and masks —
// over many steps; greedy consumes no random number; the penalty window is reduced to counts; the
// draw over a distribution; the failure codes become the CPU sampler's errors.
#include "engine/generate/device_sampling.h"

#include <gtest/gtest.h>

#include <random>

#include "kernels/error.h"

namespace exl {
namespace device_sampling_test {

std::vector<float> random_logits(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<uint32_t> random_mask(std::mt19937& rng, size_t n) {
  std::vector<uint32_t> m(mask_words(n));
  for (uint32_t& w : m) w = rng() | rng();  // ~75% allowed
  m[0] |= 1u;
  return m;
}

struct Case {
  const char* name;
  SamplerSettings s;
  bool masked;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const char* name, auto edit, bool masked) {
    SamplerSettings s;
    s.seed = 1234;
    edit(s);
    out.push_back({name, s, masked});
  };
  add("plain", [](SamplerSettings&) {}, false);
  add("greedy", [](SamplerSettings& s) { s.temperature = 0; }, true);
  add("top_k", [](SamplerSettings& s) { s.top_k = 40, s.temperature = 0.7f; }, false);
  add("top_p", [](SamplerSettings& s) { s.top_p = 0.9f; }, true);
  add("min_p", [](SamplerSettings& s) { s.min_p = 0.05f, s.temperature = 1.3f; }, false);
  add("all", [](SamplerSettings& s) {
    s.top_k = 100, s.top_p = 0.8f, s.min_p = 0.02f, s.temperature = 0.9f;
    s.repetition_penalty = 1.3f, s.frequency_penalty = 0.2f, s.presence_penalty = 0.1f, s.penalty_last_n = 16;
    s.logit_bias = {{3, 5.0f}, {7, -INFINITY}, {11, -2.5f}};
  }, true);
  add("penalties_greedy", [](SamplerSettings& s) {
    s.temperature = 0, s.repetition_penalty = 1.5f, s.frequency_penalty = 0.4f, s.penalty_last_n = -1;
  }, false);
  return out;
}

TEST(DeviceSampling, ReferenceOfDeviceRowsFollowsTheHostSamplerStepByStep) {
  const size_t V = 1001;
  for (const Case& c : cases()) {
    Sampler host(c.s), dev(c.s);
    std::mt19937 rng(77);
    const std::vector<int32_t> prompt{1, 5, 5, 9, 3, 3, 3};
    host.accept(prompt);
    dev.accept(prompt);
    int differing_steps = 0;
    for (int step = 0; step < 60; ++step) {
      auto logits = random_logits(rng, V);
      // Make the history matter: the last few tokens are near the top.
      const auto h = dev.history();
      for (size_t k = h.size() - 4; k < h.size(); ++k) logits[size_t(h[k])] = 7.0f + float(k % 3);
      std::vector<uint32_t> mask = c.masked ? random_mask(rng, V) : std::vector<uint32_t>{};
      DeviceRow row = make_device_row(dev, int64_t(V), 0, mask);
      const int32_t got = checked_sampled_token(reference_sample_row(logits, row.view()), int64_t(V));
      std::vector<float> work = logits;
      const int32_t want = host.sample(work, mask);
      ASSERT_EQ(got, want) << c.name << " step " << step;
      host.accept(want);
      dev.accept(got);
      differing_steps += step > 0 && got != host.history()[host.history().size() - 2];
    }
    EXPECT_GT(differing_steps, 5) << c.name << ": the test sequence is degenerate";
    EXPECT_EQ(dev.next_uniform(), host.next_uniform()) << c.name << ": RNG streams diverged";
  }
}

TEST(DeviceSampling, GreedyConsumesNoRandomNumber) {
  SamplerSettings s;
  s.temperature = 0;
  s.seed = 5;
  Sampler a(s), b(s);
  const DeviceRow r = make_device_row(a, 100, 3, {});
  EXPECT_EQ(r.params.u, 0.0);
  EXPECT_EQ(r.params.row, 3);
  EXPECT_EQ(a.next_uniform(), b.next_uniform());
  s.temperature = 1;
  Sampler c(s), d(s);
  const DeviceRow r2 = make_device_row(c, 100, 0, {});
  EXPECT_EQ(r2.params.u, d.next_uniform());
  EXPECT_EQ(c.next_uniform(), d.next_uniform());
}

TEST(DeviceSampling, PenaltyWindowBecomesDistinctCounts) {
  SamplerSettings s;
  s.frequency_penalty = 0.5f;
  s.penalty_last_n = 5;
  Sampler a(s);
  a.accept(std::vector<int32_t>{9, 9, 4, 7, 4, 4, 2});  // window: 4 7 4 4 2
  const auto pc = a.penalty_counts(10);
  ASSERT_EQ(pc.size(), 3u);
  EXPECT_EQ(pc[0].token, 2);
  EXPECT_EQ(pc[0].count, 1);
  EXPECT_EQ(pc[1].token, 4);
  EXPECT_EQ(pc[1].count, 3);
  EXPECT_EQ(pc[2].token, 7);
  EXPECT_EQ(pc[2].count, 1);
  EXPECT_THROW(a.penalty_counts(5), Error);  // token 7 outside a vocabulary of 5
  SamplerSettings off;  // neutral penalties: nothing to send
  Sampler b(off);
  b.accept(std::vector<int32_t>{1, 2});
  EXPECT_TRUE(b.penalty_counts(10).empty());
  const DeviceRow r = make_device_row(a, 10, 0, {});
  EXPECT_EQ(r.view().penalties.size(), 3u);
  EXPECT_EQ(r.view().penalties.data(), r.penalties.data());
}

TEST(DeviceSampling, SettingsTheDeviceCannotSampleStayOnTheHost) {
  SamplerSettings s;
  EXPECT_TRUE(device_samplable(s));
  s.typical_p = 0.9f;
  EXPECT_FALSE(device_samplable(s));
  s.typical_p = 1.0f;
  s.mode = SamplerMode::llama2c;
  EXPECT_FALSE(device_samplable(s));
  Sampler a(s);
  EXPECT_THROW(make_device_row(a, 10, 0, {}), Error);
  Sampler b(SamplerSettings{});
  EXPECT_THROW(make_device_row(b, 100, 0, std::vector<uint32_t>(3)), Error);  // needs 4 words
}

TEST(DeviceSampling, DrawWalksTheDistributionInOrder) {
  const std::vector<Sampler::TokenProb> d{{5, 0.25f}, {8, 0.0f}, {2, 0.5f}, {9, 0.25f}};
  EXPECT_EQ(draw_from(d, 0.0), 5);
  EXPECT_EQ(draw_from(d, 0.2499), 5);
  EXPECT_EQ(draw_from(d, 0.25), 2);  // r < cum is strict
  EXPECT_EQ(draw_from(d, 0.74), 2);
  EXPECT_EQ(draw_from(d, 0.9999999), 9);
  EXPECT_EQ(draw_from(std::vector<Sampler::TokenProb>{{4, 0.0f}}, 0.5), k_sample_nothing_allowed);
}

TEST(DeviceSampling, FailureCodesBecomeTheSamplerErrors) {
  EXPECT_EQ(checked_sampled_token(7, 10), 7);
  try {
    checked_sampled_token(k_sample_nothing_allowed, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no token can be sampled"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checked_sampled_token(k_sample_bad_logit, 10), Error);
  EXPECT_THROW(checked_sampled_token(10, 10), Error);
  std::vector<float> l{1.0f, NAN, 0.0f};
  EXPECT_EQ(reference_sample_row(l, RowSampling{}), k_sample_bad_logit);
  std::vector<float> ok{1.0f, 2.0f, 0.0f};
  std::vector<uint32_t> none{0u};
  RowSampling r;
  r.mask = none;
  EXPECT_EQ(reference_sample_row(ok, r), k_sample_nothing_allowed);
}

}  // namespace device_sampling_test
}  // namespace exl
