#include "engine/generate/device_sampling.h"

#include <cmath>

#include "kernels/error.h"

namespace exl {

bool device_samplable(const SamplerSettings& s) {
  return s.mode == SamplerMode::default_ && (s.typical_p <= 0.0f || s.typical_p >= 1.0f);
}

RowSampling DeviceRow::view() const {
  RowSampling r = params;
  r.penalties = penalties;
  r.bias = bias;
  r.mask = mask;
  return r;
}

DeviceRow make_device_row(Sampler& sampler, int64_t vocab, int64_t row, std::vector<uint32_t> mask) {
  const SamplerSettings& s = sampler.settings();
  EXL_CHECK(device_samplable(s), "engine: device sampling: settings (mode ", to_string(s.mode), ", typical_p ",
            s.typical_p, ") must be sampled on the host");
  EXL_CHECK(mask.empty() || mask.size() == mask_words(size_t(vocab)), "engine: device sampling: mask has ",
            mask.size(), " words, a vocabulary of ", vocab, " needs ", mask_words(size_t(vocab)));
  DeviceRow d;
  d.params.row = row;
  d.params.temperature = s.temperature;
  d.params.top_k = s.top_k;
  d.params.top_p = s.top_p;
  d.params.min_p = s.min_p;
  d.params.repetition_penalty = s.repetition_penalty;
  d.params.frequency_penalty = s.frequency_penalty;
  d.params.presence_penalty = s.presence_penalty;
  d.penalties = sampler.penalty_counts(vocab);
  for (const auto& [tok, b] : s.logit_bias) {
    EXL_CHECK(tok >= 0 && tok < vocab, "engine: device sampling: logit_bias token ", tok,
              " outside the vocabulary of ", vocab);
    d.bias.push_back({tok, b});
  }
  d.mask = std::move(mask);
  if (s.temperature > 0.0f) d.params.u = sampler.next_uniform();
  return d;
}

int32_t checked_sampled_token(int32_t result, int64_t vocab) {
  if (result == k_sample_nothing_allowed)
    fail("engine: sampler: no token can be sampled: the mask and logit_bias exclude all ", vocab, " tokens");
  EXL_CHECK(result != k_sample_bad_logit, "engine: sampler: a logit is NaN or +inf");
  EXL_CHECK(result >= 0 && result < vocab, "engine: device sampling: backend returned token ", result,
            " outside the vocabulary of ", vocab);
  return result;
}

int32_t draw_from(std::span<const Sampler::TokenProb> dist, double u) {
  double total = 0.0;
  for (const auto& c : dist) total += c.p;
  const double r = u * total;
  double cum = 0.0;
  int32_t last = k_sample_nothing_allowed;
  for (const auto& c : dist) {
    if (c.p <= 0.0f) continue;
    cum += c.p;
    last = c.token;
    if (r < cum) return c.token;
  }
  return last;
}

int32_t reference_sample_row(std::span<const float> logits, const RowSampling& row) {
  for (float l : logits)
    if (std::isnan(l) || l == INFINITY) return k_sample_bad_logit;
  SamplerSettings s;
  s.temperature = row.temperature;
  s.top_k = row.top_k;
  s.top_p = row.top_p;
  s.min_p = row.min_p;
  s.repetition_penalty = row.repetition_penalty;
  s.frequency_penalty = row.frequency_penalty;
  s.presence_penalty = row.presence_penalty;
  s.penalty_last_n = -1;
  for (const TokenBias& b : row.bias) s.logit_bias[b.token] = b.bias;
  s.seed = 0;
  Sampler sampler(s);
  for (const TokenCount& tc : row.penalties)
    for (int32_t i = 0; i < tc.count; ++i) sampler.accept(tc.token);
  std::vector<float> work(logits.begin(), logits.end());
  int32_t id = 0;
  try {
    id = sampler.sample(work, row.mask);
  } catch (const Error&) {
    return k_sample_nothing_allowed;  // the inputs are checked above: only an empty candidate set is left
  }
  if (row.temperature == 0.0f) return id;
  const auto dist = sampler.last_distribution();
  return draw_from(dist, row.u);
}

}  // namespace exl
