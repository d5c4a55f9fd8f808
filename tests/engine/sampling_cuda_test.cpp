// The CUDA backend's sample_rows (kernels/cuda/sampling.h) against the CPU sampler
// (engine/generate/sampler.h) on random logits with exact ties: vocabularies 1000, 32001 and 128256, with
// and without a mask, penalties and biases, greedy and every combination of temperature, top_k,
// top_p and min_p, 16 uniforms per row. Greedy ids must be identical. Sampled ids must equal the
// CPU's draw for the same u; where they differ, the GPU id must be the CPU's for u ± 1e-6 or for
// top_p / min_p ± 1e-6 (a cumulative sum within float rounding of the cut), and such cases must
// stay below 0.5%. Skips without a CUDA device. (cuda_sampler_test.cpp: the same check on small
// vocabularies, also runnable on the CPU emulator.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/generate/device_sampling.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "kernels/error.h"
#include "cuda_test_support.h"
#include "test_support.h"

namespace exl {
namespace sampling_cuda_test {

struct Config {
  float temperature;
  int32_t top_k;
  float top_p, min_p;
};

std::vector<Config> configs() {
  std::vector<Config> out{{0.0f, 0, 1.0f, 0.0f}};
  for (float t : {0.7f, 1.0f})
    for (int32_t k : {0, 1, 40})
      for (float p : {1.0f, 0.9f})
        for (float mp : {0.0f, 0.05f}) out.push_back({t, k, p, mp});
  return out;
}

std::vector<float> random_logits(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.5f, 2.5f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = nd(rng);
    if (x == 0.0f) x = 0.25f;
  }
  for (size_t i = 0; i + 7 < n; i += n / 5 + 3) v[i + 7] = v[i];  // exact ties
  v[n / 2 + 1] = v[size_t(std::max_element(v.begin(), v.end()) - v.begin())];  // a tie at the top
  return v;
}

// The CPU draws for u, and for u, top_p and min_p nudged by ±1e-6.
struct CpuRef {
  SamplerSettings s;
  std::vector<int32_t> history;
  std::vector<float> logits;
  std::vector<uint32_t> mask;
  std::vector<Sampler::TokenProb> dist(const SamplerSettings& st) const {
    Sampler sm(st);
    sm.accept(history);
    std::vector<float> w = logits;
    const int32_t id = sm.sample(w, mask);
    if (st.temperature == 0.0f) return {{id, 1.0f}};
    return sm.last_distribution();
  }
  bool near(int32_t got, double u) const {
    std::vector<SamplerSettings> variants{s};
    for (float d : {-1e-6f, 1e-6f}) {
      SamplerSettings a = s, b = s;
      if (s.top_p > 0.0f && s.top_p < 1.0f) a.top_p = std::clamp(s.top_p + d, 0.0f, 1.0f), variants.push_back(a);
      if (s.min_p > 0.0f) b.min_p = s.min_p + d, variants.push_back(b);
    }
    for (const auto& v : variants) {
      const auto d = dist(v);
      for (double du : {-1e-6, 0.0, 1e-6})
        if (draw_from(d, std::clamp(u + du, 0.0, 0.9999999)) == got) return true;
    }
    return false;
  }
};

TEST(CudaSampling, SameIdsAsTheCpuSampler) {
  EXL_REQUIRE_CUDA();
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(2024);
  constexpr int k_rows = 4, k_us = 16;
  const std::vector<int64_t> vocabs{1000, 32001, 128256};
  int64_t total = 0, near_only = 0;
  for (int64_t V : vocabs) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool masked = variant & 1, penalized = variant & 2;
      std::vector<float> logits;
      for (int r = 0; r < k_rows; ++r) {
        auto l = random_logits(rng, size_t(V));
        logits.insert(logits.end(), l.begin(), l.end());
      }
      Buffer dl = gpu->alloc(logits.size() * 4);
      gpu->upload(dl.data(), logits.data(), logits.size() * 4);
      std::vector<std::vector<uint32_t>> masks(k_rows);
      std::vector<std::vector<int32_t>> hist(k_rows);
      for (int r = 0; r < k_rows; ++r) {
        if (masked) {
          masks[size_t(r)].resize(mask_words(size_t(V)));
          for (uint32_t& w : masks[size_t(r)]) w = rng() | rng();
        }
        for (int i = 0; i < 30; ++i) hist[size_t(r)].push_back(int32_t(rng() % 50));  // repeats
      }
      for (const Config& c : configs()) {
        SamplerSettings s;
        s.temperature = c.temperature, s.top_k = c.top_k, s.top_p = c.top_p, s.min_p = c.min_p;
        s.seed = 1;
        if (penalized) {
          s.repetition_penalty = 1.3f, s.frequency_penalty = 0.25f, s.presence_penalty = 0.5f;
          s.penalty_last_n = 24;
          s.logit_bias = {{0, 3.0f}, {2, -INFINITY}, {int32_t(V - 1), 6.5f}, {45, -1.5f}};
        }
        std::vector<CpuRef> refs;
        std::vector<DeviceRow> rows;
        std::vector<double> us;
        for (int r = 0; r < k_rows; ++r) {
          CpuRef ref{s, hist[size_t(r)],
                     std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V), masks[size_t(r)]};
          Sampler sm(s);
          sm.accept(hist[size_t(r)]);
          for (int k = 0; k < k_us; ++k) {
            rows.push_back(make_device_row(sm, V, r, masks[size_t(r)]));
            const double u = k == 0 ? 0.0 : k == 1 ? 0.9999999 : std::uniform_real_distribution<double>(0, 1)(rng);
            rows.back().params.u = u;
            us.push_back(u);
          }
          refs.push_back(std::move(ref));
        }
        std::vector<RowSampling> params;
        for (const auto& d : rows) params.push_back(d.view());
        std::vector<int32_t> got(params.size());
        ASSERT_TRUE(gpu->sample_rows(dl.f32(), V, params, got));
        for (int r = 0; r < k_rows; ++r) {
          const auto dist = refs[size_t(r)].dist(s);
          for (int k = 0; k < k_us; ++k) {
            const size_t e = size_t(r * k_us + k);
            const int32_t want = draw_from(dist, us[e]);
            ++total;
            if (got[e] == want) continue;
            const std::string where = cat("V ", V, " mask ", masked, " pen ", penalized, " T ", c.temperature,
                                          " k ", c.top_k, " p ", c.top_p, " min_p ", c.min_p, " row ", r, " u ",
                                          us[e], ": gpu ", got[e], " cpu ", want);
            ASSERT_NE(c.temperature, 0.0f) << "greedy differs: " << where;
            ASSERT_TRUE(refs[size_t(r)].near(got[e], us[e])) << where;
            ++near_only;
          }
        }
      }
    }
  }
  std::cout << "[          ] " << total << " sampled entries, " << near_only << " differ within rounding\n";
  EXPECT_LE(near_only * 200, total);
}

TEST(CudaSampling, FailureCodesAndInputChecks) {
  EXL_REQUIRE_CUDA();
  auto gpu = make_cuda_backend(0);
  const int64_t V = 77;
  std::vector<float> logits(size_t(2 * V), 1.5f);
  logits[size_t(V + 5)] = NAN;
  Buffer dl = gpu->alloc(logits.size() * 4);
  gpu->upload(dl.data(), logits.data(), logits.size() * 4);
  std::vector<uint32_t> none(mask_words(size_t(V)), 0u), one(mask_words(size_t(V)), 0u);
  one[2] = 1u << 3;  // token 67
  std::vector<TokenBias> kill{{67, -INFINITY}};
  std::vector<RowSampling> rows(5);
  rows[0].mask = none;
  rows[1].row = 1;
  rows[2].mask = one;
  rows[2].u = 0.5;
  rows[3].mask = one, rows[3].bias = kill;
  rows[4].temperature = 0;  // all equal: the lowest id
  std::vector<int32_t> out(rows.size());
  ASSERT_TRUE(gpu->sample_rows(dl.f32(), V, rows, out));
  EXPECT_EQ(out, (std::vector<int32_t>{k_sample_nothing_allowed, k_sample_bad_logit, 67, k_sample_nothing_allowed, 0}));
  std::vector<TokenBias> outside{{int32_t(V), 1.0f}};
  rows[0].bias = outside;
  EXPECT_THROW(gpu->sample_rows(dl.f32(), V, rows, out), Error);
  EXPECT_TRUE(gpu->sample_rows(nullptr, V, {}, {}));
  EXPECT_TRUE(gpu->capabilities().sample_rows);
  EXPECT_TRUE(gpu->capabilities().sample_rows_deferred);
}

}  // namespace sampling_cuda_test
}  // namespace exl
