// What Backend::sample_rows needs to pick one token from one logits row: the engine's sampler
// settings (engine/generate/sampler.h, default mode) reduced to plain values, host memory only. The
// meaning of every field and the order of the steps are those of engine/generate/sampler.h:
//   bias → mask → penalties → temperature 0: argmax (lowest id among equal maxima), else
//   (l - max) / T → top_k → softmax → top_p → min_p → draw with r = u · mass.
// typical_p and the llama2c mode have no field here: jobs using them sample on the host.
#pragma once
#include <cstdint>
#include <span>

namespace exl {

// A distinct token of the penalty window and how often it occurs there.
struct TokenCount {
  int32_t token = 0;
  int32_t count = 0;
};

// An additive logit bias (finite or -inf) for a distinct token.
struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;
};

// One row to sample. The spans are host memory read during the call only.
struct RowSampling {
  int64_t row = 0;                 // which logits row (rows may be sampled more than once)
  float temperature = 1.0f;        // 0 = greedy
  int32_t top_k = 0;               // 0 = off
  float top_p = 1.0f;              // 0 or 1 = off
  float min_p = 0.0f;              // 0 = off
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::span<const TokenCount> penalties;  // distinct ids < vocab; empty = no penalty
  std::span<const TokenBias> bias;        // distinct ids < vocab
  std::span<const uint32_t> mask;         // empty = all allowed; else mask_words(vocab) words,
                                          // bit t % 32 of word t / 32 set = token t allowed
  double u = 0.0;                  // uniform [0, 1) for the draw; unused when greedy
};

// sample_rows results that are not token ids.
constexpr int32_t k_sample_nothing_allowed = -1;  // mask and biases exclude every token
constexpr int32_t k_sample_bad_logit = -2;        // a logit is NaN or +inf

}  // namespace exl
