#include "engine/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/error.h"

namespace exl {

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

bool is_allowed(std::span<const uint32_t> mask, size_t t) {
  return mask.empty() || ((mask[t >> 5] >> (t & 31)) & 1u) != 0;
}

// Lowest index among equal maxima; -1 when every logit is -inf.
int32_t argmax_lowest(std::span<const float> x) {
  int32_t best = -1;
  float best_v = neg_inf;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > best_v) {
      best_v = x[i];
      best = int32_t(i);
    }
  }
  return best;
}

[[noreturn]] void fail_nothing_allowed(size_t n) {
  fail("engine: sampler: no token can be sampled: the mask and logit_bias exclude all ", n,
       " tokens");
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// The same float operations, in the same order, as run.c softmax().
void softmax_like_llama2c(std::span<float> x) {
  float max_val = x[0];
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (float& v : x) {
    v = ::expf(v - max_val);
    sum += v;
  }
  for (float& v : x) v /= sum;
}

template <typename Cand>
void renormalize(std::vector<Cand>& c) {
  double sum = 0.0;
  for (const Cand& x : c) sum += x.p;
  for (Cand& x : c) x.p = float(x.p / sum);
}

// Rank order: larger logit first, ties by lower id.
constexpr auto by_rank = [](const auto& a, const auto& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
};

}  // namespace

std::string to_string(SamplerMode m) {
  switch (m) {
    case SamplerMode::default_: return "default";
    case SamplerMode::llama2c: return "llama2c";
  }
  return "?";
}

SamplerMode parse_sampler_mode(std::string_view s) {
  if (s == "default") return SamplerMode::default_;
  if (s == "llama2c") return SamplerMode::llama2c;
  fail("engine: sampler: unknown sampler mode '", s, "' (expected default or llama2c)");
}

void validate(const SamplerSettings& s, int64_t vocab_size) {
  auto in01 = [](float v) { return v >= 0.0f && v <= 1.0f; };
  const char* p = "engine: sampler: ";
  EXL_CHECK(std::isfinite(s.temperature) && s.temperature >= 0.0f, p,
            "temperature must be finite and >= 0, got ", s.temperature);
  EXL_CHECK(s.top_k >= 0, p, "top_k must be >= 0, got ", s.top_k);
  EXL_CHECK(in01(s.top_p), p, "top_p must be in [0, 1], got ", s.top_p);
  EXL_CHECK(in01(s.min_p), p, "min_p must be in [0, 1], got ", s.min_p);
  EXL_CHECK(in01(s.typical_p), p, "typical_p must be in [0, 1], got ", s.typical_p);
  EXL_CHECK(std::isfinite(s.repetition_penalty) && s.repetition_penalty > 0.0f, p,
            "repetition_penalty must be finite and > 0, got ", s.repetition_penalty);
  EXL_CHECK(std::isfinite(s.frequency_penalty), p, "frequency_penalty must be finite, got ",
            s.frequency_penalty);
  EXL_CHECK(std::isfinite(s.presence_penalty), p, "presence_penalty must be finite, got ",
            s.presence_penalty);
  EXL_CHECK(s.penalty_last_n >= -1, p, "penalty_last_n must be >= -1, got ", s.penalty_last_n);
  for (const auto& [tok, bias] : s.logit_bias) {
    EXL_CHECK(tok >= 0 && (vocab_size <= 0 || tok < vocab_size), p, "logit_bias token ", tok,
              " outside the vocabulary of ", vocab_size);
    EXL_CHECK(!std::isnan(bias) && bias != std::numeric_limits<float>::infinity(), p,
              "logit_bias for token ", tok, " must be finite or -inf, got ", bias);
  }
  if (s.mode == SamplerMode::llama2c) {
    const bool neutral = s.top_k == 0 && s.min_p == 0.0f &&
                         (s.typical_p == 0.0f || s.typical_p == 1.0f) &&
                         s.repetition_penalty == 1.0f && s.frequency_penalty == 0.0f &&
                         s.presence_penalty == 0.0f;
    EXL_CHECK(neutral, p,
              "llama2c mode supports only temperature, top_p, seed, logit_bias and the mask; "
              "top_k, min_p, typical_p and the penalties must be neutral");
  }
}

Sampler::Sampler(SamplerSettings settings) : settings_(std::move(settings)) {
  validate(settings_);
  if (settings_.mode == SamplerMode::llama2c) {
    seed_ = settings_.seed.value_or(0);
    while (seed_ == 0) seed_ = random_seed();
    llama2c_rng_.state = seed_;
  } else {
    seed_ = settings_.seed ? *settings_.seed : random_seed();
    rng_ = Xoshiro256(seed_);
  }
}

std::vector<Sampler::TokenProb> Sampler::last_distribution() const {
  std::vector<TokenProb> out;
  if (!cands_are_distribution_) return out;
  out.reserve(cands_.size());
  for (const Candidate& c : cands_) out.push_back({c.id, c.p});
  return out;
}

void Sampler::accept(int32_t token) {
  EXL_CHECK(token >= 0, "engine: sampler: accepted token id ", token, " is negative");
  history_.push_back(token);
}

void Sampler::accept(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) accept(t);
}

void Sampler::rollback(size_t n) {
  EXL_CHECK(n <= history_.size(), "engine: sampler: rollback of ", n, " tokens, history has ",
            history_.size());
  history_.resize(history_.size() - n);
}

int32_t Sampler::sample(std::span<float> logits, std::span<const uint32_t> allowed_mask) {
  const size_t n = logits.size();
  EXL_CHECK(n > 0 && n <= size_t(std::numeric_limits<int32_t>::max()),
            "engine: sampler: logits must hold 1 to 2^31-1 entries, got ", n);
  EXL_CHECK(allowed_mask.empty() || allowed_mask.size() >= mask_words(n), "engine: sampler: mask has ",
            allowed_mask.size(), " words, a vocabulary of ", n, " needs ", mask_words(n));
  if (!settings_.logit_bias.empty()) {
    const int32_t last = settings_.logit_bias.rbegin()->first;
    EXL_CHECK(size_t(last) < n, "engine: sampler: logit_bias token ", last,
              " outside the vocabulary of ", n);
  }
  for (size_t i = 0; i < n; ++i) {
    EXL_CHECK(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(),
              "engine: sampler: logit of token ", i, " is ", logits[i]);
  }
  cands_are_distribution_ = false;
  apply_bias_and_mask(logits, allowed_mask);
  if (settings_.mode == SamplerMode::llama2c) return sample_llama2c(logits);
  return sample_default(logits);
}

void Sampler::apply_bias_and_mask(std::span<float> logits, std::span<const uint32_t> mask) const {
  for (const auto& [tok, bias] : settings_.logit_bias) logits[size_t(tok)] += bias;
  if (mask.empty()) return;
  for (size_t w = 0; w < mask_words(logits.size()); ++w) {
    if (mask[w] == ~0u) continue;
    const size_t end = std::min(logits.size(), (w + 1) * 32);
    for (size_t t = w * 32; t < end; ++t)
      if (!is_allowed(mask, t)) logits[t] = neg_inf;
  }
}

std::vector<TokenCount> Sampler::penalty_counts(int64_t vocab_size) const {
  const SamplerSettings& s = settings_;
  std::vector<TokenCount> out;
  if (history_.empty() || s.penalty_last_n == 0) return out;
  if (s.repetition_penalty == 1.0f && s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f)
    return out;
  const size_t w = s.penalty_last_n < 0 ? history_.size()
                                        : std::min(history_.size(), size_t(s.penalty_last_n));
  std::vector<int32_t> window(history_.end() - std::ptrdiff_t(w), history_.end());
  std::sort(window.begin(), window.end());
  for (size_t i = 0; i < window.size();) {
    const int32_t t = window[i];
    size_t j = i;
    while (j < window.size() && window[j] == t) ++j;
    EXL_CHECK(int64_t(t) < vocab_size, "engine: sampler: history token ", t,
              " outside the vocabulary of ", vocab_size);
    out.push_back({t, int32_t(j - i)});
    i = j;
  }
  return out;
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const SamplerSettings& s = settings_;
  for (const TokenCount& tc : penalty_counts(int64_t(logits.size()))) {
    float& l = logits[size_t(tc.token)];
    if (l == neg_inf) continue;
    if (s.repetition_penalty != 1.0f) l = l > 0.0f ? l / s.repetition_penalty : l * s.repetition_penalty;
    l -= float(tc.count) * s.frequency_penalty + s.presence_penalty;
  }
}

int32_t Sampler::sample_default(std::span<float> logits) {
  apply_penalties(logits);
  const size_t n = logits.size();
  if (settings_.temperature == 0.0f) {
    const int32_t t = argmax_lowest(logits);
    if (t < 0) fail_nothing_allowed(n);
    cands_.assign(1, {0.0f, 1.0f, t});
    cands_are_distribution_ = true;
    return t;
  }
  const int32_t top = argmax_lowest(logits);
  if (top < 0) fail_nothing_allowed(n);
  const float max_l = logits[size_t(top)];
  const float temp = settings_.temperature;
  cands_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (logits[i] == neg_inf) continue;
    // (l - max) / T stays finite-or--inf where l / T alone could overflow for tiny T.
    cands_.push_back({(logits[i] - max_l) / temp, 0.0f, int32_t(i)});
    logits[i] /= temp;
  }
  const size_t k = size_t(settings_.top_k);
  if (k > 0 && k < cands_.size()) {
    std::nth_element(cands_.begin(), cands_.begin() + std::ptrdiff_t(k - 1), cands_.end(), by_rank);
    cands_.resize(k);
    std::sort(cands_.begin(), cands_.end(), by_rank);  // a defined draw order (the GPU's)
  }
  double sum = 0.0;
  for (Candidate& c : cands_) {
    c.p = std::exp(c.logit);
    sum += c.p;
  }
  for (Candidate& c : cands_) c.p = float(c.p / sum);
  if (settings_.top_p > 0.0f && settings_.top_p < 1.0f) keep_top_p();
  if (settings_.min_p > 0.0f) keep_min_p();
  if (settings_.typical_p > 0.0f && settings_.typical_p < 1.0f) keep_typical();
  cands_are_distribution_ = true;
  return draw();
}

void Sampler::keep_top_p() {
  const double target = settings_.top_p;
  const size_t n = cands_.size();
  size_t sorted = 0, i = 0, k = std::min<size_t>(n, 64);
  double cum = 0.0;
  // Sort lazily in growing batches: the nucleus is usually a short prefix of a large vocabulary.
  // Each batch is selected from the unsorted rest (linear) and then sorted.
  for (;;) {
    const auto first = cands_.begin() + std::ptrdiff_t(sorted), last = cands_.begin() + std::ptrdiff_t(k);
    if (k < n) std::nth_element(first, last - 1, cands_.end(), by_rank);
    std::sort(first, last, by_rank);
    for (; i < k; ++i) {
      cum += cands_[i].p;
      if (cum >= target) {
        cands_.resize(i + 1);
        renormalize(cands_);
        return;
      }
    }
    if (k == n) return;
    sorted = k;
    k = std::min(n, k * 8);
  }
}

void Sampler::keep_min_p() {
  float p_max = 0.0f;
  for (const Candidate& c : cands_) p_max = std::max(p_max, c.p);
  const float threshold = settings_.min_p * p_max;
  std::erase_if(cands_, [&](const Candidate& c) { return c.p < threshold; });
  renormalize(cands_);
}

void Sampler::keep_typical() {
  double entropy = 0.0;
  for (const Candidate& c : cands_)
    if (c.p > 0.0f) entropy -= double(c.p) * std::log(double(c.p));
  struct Scored {
    double score;
    Candidate c;
  };
  std::vector<Scored> scored;
  scored.reserve(cands_.size());
  for (const Candidate& c : cands_) {
    const double surprise = c.p > 0.0f ? -std::log(double(c.p)) : std::numeric_limits<double>::infinity();
    scored.push_back({std::abs(surprise - entropy), c});
  }
  std::sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) {
    return a.score < b.score || (a.score == b.score && by_rank(a.c, b.c));
  });
  const double target = settings_.typical_p;
  double cum = 0.0;
  size_t keep = scored.size();
  for (size_t i = 0; i < scored.size(); ++i) {
    cum += scored[i].c.p;
    if (cum >= target) {
      keep = i + 1;
      break;
    }
  }
  cands_.clear();
  for (size_t i = 0; i < keep; ++i) cands_.push_back(scored[i].c);
  renormalize(cands_);
}

int32_t Sampler::draw() {
  double total = 0.0;
  for (const Candidate& c : cands_) total += c.p;
  const double r = rng_.uniform() * total;
  double cum = 0.0;
  int32_t last = -1;
  for (const Candidate& c : cands_) {
    if (c.p <= 0.0f) continue;
    cum += c.p;
    last = c.id;
    if (r < cum) return c.id;
  }
  if (last < 0) fail_nothing_allowed(cands_.size());
  return last;
}

int32_t Sampler::sample_llama2c(std::span<float> x) {
  const size_t n = x.size();
  const int32_t top = argmax_lowest(x);
  if (top < 0) fail_nothing_allowed(n);
  if (settings_.temperature == 0.0f) return top;
  size_t last_allowed = 0;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != neg_inf) last_allowed = i;
    x[i] /= settings_.temperature;
  }
  softmax_like_llama2c(x);
  const float coin = llama2c_rng_.next_f32();
  const float topp = settings_.top_p;
  if (topp <= 0.0f || topp >= 1.0f || n == 1) {
    float cdf = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      cdf += x[i];
      if (coin < cdf) return int32_t(i);
    }
    // run.c returns n - 1 here; with nothing excluded, last_allowed is n - 1.
    return int32_t(last_allowed);
  }
  const float cutoff = (1.0f - topp) / float(int(n) - 1);
  cands_.clear();
  for (size_t i = 0; i < n; ++i)
    if (x[i] >= cutoff) cands_.push_back({0.0f, x[i], int32_t(i)});
  // run.c reads out of bounds here; only reachable when top_p < 1/n.
  if (cands_.empty()) return top;
  std::stable_sort(cands_.begin(), cands_.end(),
                   [](const Candidate& a, const Candidate& b) { return a.p > b.p; });
  float cum = 0.0f;
  size_t last = cands_.size() - 1;
  for (size_t i = 0; i < cands_.size(); ++i) {
    cum += cands_[i].p;
    if (cum > topp) {
      last = i;
      break;
    }
  }
  const float r = coin * cum;
  float cdf = 0.0f;
  for (size_t i = 0; i <= last; ++i) {
    cdf += cands_[i].p;
    if (r < cdf) return cands_[i].id;
  }
  return cands_[last].id;
}

}  // namespace exl
