// The CUDA sampler (kernels/cuda/cuda_sampler.h → sampling.cu) driven directly, against the host
// reference of sample_rows (engine/generate/device_sampling.h, i.e. the CPU Sampler): small vocabularies
// (odd and even), exact ties, masks, penalties, biases, greedy and every filter combination,
// several u per row including 0 and 1 - 1e-7. Ids must match, or match the reference for u,
// top_p or min_p nudged by 1e-6 (float rounding at a cut or boundary). CUDA builds only; skips
// without a device. Also runs on the CPU under the emulator: make -C tests/cuda_emu sampling.
#ifdef EXL_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <utility>

#include "engine/generate/device_sampling.h"
#include "kernels/cuda/cuda_sampler.h"
#include "kernels/cuda/sampling.h"
#include "kernels/error.h"
#include "kernels/cuda_device.h"

namespace exl {
namespace cuda_sampler_test {

int32_t reference_near(std::span<const float> logits, RowSampling r, int32_t got) {
  const int32_t want = reference_sample_row(logits, r);
  if (want == got || r.temperature == 0.0f) return want;
  for (int which = 0; which < 3; ++which)
    for (double d : {-1e-6, 1e-6}) {
      RowSampling v = r;
      if (which == 0) v.u = std::clamp(r.u + d, 0.0, 0.9999999);
      if (which == 1 && r.top_p > 0.0f && r.top_p < 1.0f) v.top_p = std::clamp(r.top_p + float(d), 0.0f, 1.0f);
      if (which == 2 && r.min_p > 0.0f) v.min_p = r.min_p + float(d);
      if (reference_sample_row(logits, v) == got) return got;
    }
  return want;
}

// k_rows rows of normal logits over V ids, with a three-way tie at the top (17, 300 and 901 when V
// has them) and ties below it.
std::vector<float> tied_logits(int64_t V, int k_rows, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(k_rows * V));
  for (float& x : logits) x = nd(rng) + 0.125f;
  for (int r = 0; r < k_rows; ++r) {
    float* row = logits.data() + r * V;
    const float top = *std::max_element(row, row + V);
    for (int64_t t : {17, 300, 901})
      if (t < V) row[t] = top;
    for (int64_t i = 0; i < 40 && 500 + i < V; ++i) row[500 + i] = row[100 + i % 7];
  }
  return logits;
}

// Every setting combination (greedy ones without u, top_k, top_p or min_p) with and without a mask
// and penalties + biases, over logits rows 0 .. k_rows - 1 in turn.
std::vector<RowSampling> every_setting(int k_rows, std::span<const uint32_t> mask, std::span<const TokenCount> pens,
                                       std::span<const TokenBias> bias) {
  std::vector<RowSampling> rows;
  for (float t : {0.0f, 0.6f, 1.0f})
    for (int32_t k : {0, 1, 30})
      for (float p : {1.0f, 0.85f})
        for (float mp : {0.0f, 0.1f})
          for (int extras = 0; extras < 4; ++extras)
            for (double u : {0.0, 0.37, 0.9999999}) {
              if (t == 0.0f && (k || p < 1.0f || mp > 0.0f || u > 0.0)) continue;
              RowSampling r;
              r.row = int64_t(rows.size() % k_rows);
              r.temperature = t, r.top_k = k, r.top_p = p, r.min_p = mp, r.u = u;
              if (extras & 1) r.mask = mask;
              if (extras & 2) {
                r.penalties = pens, r.bias = bias;
                r.repetition_penalty = 1.4f, r.frequency_penalty = 0.3f, r.presence_penalty = 0.2f;
              }
              rows.push_back(r);
            }
  return rows;
}

struct Agreement {
  int64_t total = 0, exact = 0;
};

// Samples `rows` in one call from `device` (the upload of `logits`) and asserts each id against the
// host reference (reference_near).
void expect_reference(cuda::CudaSampler& sampler, const Buffer& device, std::span<const float> logits, int64_t V,
                      std::span<const RowSampling> rows, Agreement& agreed) {
  std::vector<int32_t> got(rows.size());
  sampler.run(device.f32(), V, rows, got);
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowSampling& r = rows[i];
    const std::span<const float> row = logits.subspan(size_t(r.row * V), size_t(V));
    const int32_t want = reference_near(row, r, got[i]);
    ++agreed.total;
    agreed.exact += reference_sample_row(row, r) == got[i];
    ASSERT_EQ(got[i], want) << "V " << V << ", " << rows.size() << " entries: entry " << i << " T " << r.temperature
                            << " k " << r.top_k << " p " << r.top_p << " min_p " << r.min_p << " u " << r.u
                            << " mask " << !r.mask.empty() << " penalties " << !r.penalties.empty();
  }
}

TEST(CudaSampler, MatchesTheHostReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description();
  cuda::CudaContext ctx(0);
  cuda::CudaSampler sampler(ctx);
  std::mt19937 rng(11);
  Agreement agreed;
  for (int64_t V : {int64_t(1000), int64_t(1537)}) {
    constexpr int k_rows = 3;
    const std::vector<float> logits = tied_logits(V, k_rows, rng);
    std::vector<uint32_t> mask(mask_words(size_t(V)));
    for (uint32_t& w : mask) w = rng() | rng() | rng();
    const std::vector<TokenCount> pens{{3, 2}, {17, 1}, {100, 4}, {int32_t(V - 1), 1}};
    const std::vector<TokenBias> bias{{5, 2.5f}, {300, -INFINITY}, {640, 4.0f}};
    expect_reference(sampler, ctx.upload_new(logits), logits, V, every_setting(k_rows, mask, pens, bias), agreed);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(agreed.exact * 100, agreed.total * 99) << agreed.exact << " of " << agreed.total << " identical";
}

// About one wave of 1024-thread blocks in all (two per multiprocessor), 1..64 per entry. Host-only.
TEST(CudaSampler, BlocksPerEntryFillOneWave) {
  EXPECT_EQ(cuda::sample_slices(1, 132), 64);
  EXPECT_EQ(cuda::sample_slices(8, 132), 33);
  EXPECT_EQ(cuda::sample_slices(64, 132), 5);
  EXPECT_EQ(cuda::sample_slices(300, 132), 1);
  EXPECT_EQ(cuda::sample_slices(0, 132), 1);
  EXPECT_EQ(cuda::sample_slices(1, 0), 2);
}

// The blocks per entry follow the entry count (sample_slices: 64 for one entry, one for hundreds):
// greedy entries (masked densely and sparsely, with and without biases) among sampled ones,
// shuffled and sampled 1, 5 and 40 at a time, over vocabularies smaller than the blocks (empty
// slices), near them and larger, with a NaN logit in one row (every entry of that row gets
// k_sample_bad_logit, whichever block holds it).
TEST(CudaSampler, EveryBlockCountMatchesTheHostReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description();
  cuda::CudaContext ctx(0);
  cuda::CudaSampler sampler(ctx);
  std::mt19937 rng(5);
  Agreement agreed;
  for (int64_t V : {int64_t(37), int64_t(70), int64_t(5003)}) {
    constexpr int k_rows = 4;
    std::vector<float> logits = tied_logits(V, k_rows, rng);
    logits[size_t(3 * V + V / 2)] = NAN;
    std::vector<uint32_t> mask(mask_words(size_t(V))), sparse(mask.size());
    for (uint32_t& w : mask) w = rng() | rng();
    for (uint32_t& w : sparse) w = rng() & rng();
    const std::vector<TokenCount> pens{{3, 2}, {int32_t(V - 1), 1}};
    const std::vector<TokenBias> bias{{5, 2.5f}, {int32_t(V / 3), 4.0f}};
    std::vector<RowSampling> all = every_setting(k_rows, mask, pens, bias);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(60);
    for (int r = 0; r < k_rows; ++r)  // greedy entries of every row, as they come in batched decoding
      for (int extras = 0; extras < 8; ++extras) {
        RowSampling g;
        g.row = r, g.temperature = 0.0f;
        if (extras & 1) g.mask = extras & 4 ? std::span<const uint32_t>(sparse) : std::span<const uint32_t>(mask);
        if (extras & 2) g.penalties = pens, g.bias = bias, g.repetition_penalty = 1.4f;
        all.push_back(g);
      }
    std::shuffle(all.begin(), all.end(), rng);
    const Buffer device = ctx.upload_new(logits);
    for (const auto& [n, upto] : {std::pair<size_t, size_t>{1, 30}, {5, 60}, {40, 80}})
      for (size_t at = 0; at + n <= std::min(all.size(), upto); at += n) {
        expect_reference(sampler, device, logits, V, std::span<const RowSampling>(all).subspan(at, n), agreed);
        if (HasFatalFailure()) return;
      }
  }
  EXPECT_GE(agreed.exact * 100, agreed.total * 99) << agreed.exact << " of " << agreed.total << " identical";
}

// top_k and top_p sort only the head of the rank order (the first key bins holding top_k
// candidates, or top_p of the mass): a peaked row (a few logits far above the rest, as a language
// model's), a flat one (every candidate ties: the head is all of them, in id order) and a row of
// evenly spread logits whose cuts fall inside bins, over a vocabulary of 20,000 ids.
TEST(CudaSampler, TheHeadOfTheRankOrderHoldsEveryCut) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description();
  cuda::CudaContext ctx(0);
  cuda::CudaSampler sampler(ctx);
  constexpr int64_t V = 20000;
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits(size_t(3 * V));
  for (int64_t i = 0; i < V; ++i) {
    logits[size_t(i)] = nd(rng);
    logits[size_t(V + i)] = 0.25f;
    logits[size_t(2 * V + i)] = -8.0f + 16.0f * float(i) / float(V);
  }
  for (int64_t t : {7, 4000, 4001, 19999}) logits[size_t(t)] = 11.0f + float(t % 5);
  std::vector<RowSampling> rows;
  for (int64_t row = 0; row < 3; ++row)
    for (float t : {0.7f, 1.5f})
      for (int32_t k : {0, 1, 3, 50, 19999})
        for (float p : {1.0f, 0.5f, 0.95f, 0.9999f})
          for (double u : {0.1, 0.6, 0.999}) {
            if (k == 0 && p == 1.0f) continue;
            RowSampling r;
            r.row = row, r.temperature = t, r.top_k = k, r.top_p = p, r.u = u;
            r.min_p = k == 3 ? 0.05f : 0.0f;
            rows.push_back(r);
          }
  Agreement agreed;
  expect_reference(sampler, ctx.upload_new(logits), logits, V, rows, agreed);
  EXPECT_GE(agreed.exact * 100, agreed.total * 99) << agreed.exact << " of " << agreed.total << " identical";
}

TEST(CudaSampler, RejectsIdsOutsideTheVocabulary) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description();
  cuda::CudaContext ctx(0);
  cuda::CudaSampler sampler(ctx);
  Buffer dl = ctx.upload_new(std::vector<float>(10, 1.0f));
  const std::vector<TokenBias> bias{{10, 1.0f}};
  const std::vector<TokenCount> pens{{-1, 1}};
  std::vector<uint32_t> short_mask;
  std::vector<RowSampling> rows(1);
  std::vector<int32_t> out(1);
  rows[0].bias = bias;
  EXPECT_THROW(sampler.run(dl.f32(), 10, rows, out), Error);
  rows[0].bias = {};
  rows[0].penalties = pens;
  EXPECT_THROW(sampler.run(dl.f32(), 10, rows, out), Error);
  rows[0].penalties = {};
  rows[0].u = 1.0;
  EXPECT_THROW(sampler.run(dl.f32(), 10, rows, out), Error);
  rows[0].u = 0.55;
  sampler.run(dl.f32(), 10, rows, out);
  EXPECT_EQ(out[0], 5);  // ten equal logits: u = 0.55 falls in the sixth tenth
}

}  // namespace cuda_sampler_test
}  // namespace exl
#endif
