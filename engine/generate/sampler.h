// Token sampling from a logits vector: the CPU reference that the GPU sampling path mirrors.
// A Sampler is per job: it owns the settings, the RNG stream and the token history used by the
// penalties. Engine thread only (one job's sampler is never used by two threads at once).
//
// Default mode, in this order (matching llama.cpp / HF processors):
//   1. logit_bias: logits[t] += bias (out-of-range ids are rejected by validate()).
//   2. mask: tokens whose bit is clear become -inf (so a bias cannot re-enable them).
//   3. penalties over the last penalty_last_n history tokens, per distinct token t seen c times:
//      CTRL repetition penalty l = l > 0 ? l / rp : l * rp, then OpenAI
//      l -= c * frequency_penalty + presence_penalty.
//   4. temperature == 0: greedy, the lowest index among equal maxima. Otherwise l /= temperature.
//   5. candidates = tokens with a logit > -inf; top_k keeps the k largest logits.
//      (From here on candidates are in id order, or in rank order — logit descending, ties by
//      lower id — once top_k cut something or top_p is on; the draw walks them in that order.)
//   6. softmax; top_p keeps the shortest prefix (by logit, descending; ties by lower id) whose
//      mass reaches top_p, including the token that crosses it; renormalize.
//   7. min_p keeps p >= min_p * max p; renormalize.
//   8. typical_p (Meister et al.): with H the entropy, keeps tokens in increasing order of
//      |-ln p - H| until their mass reaches typical_p (crossing token included); renormalize.
//   9. multinomial draw with r = uniform[0,1) * mass (xoshiro256**, seeded).
// After sample(), `logits` holds the values after steps 1-4 (biased, masked, penalized, divided by
// the temperature).
//
// llama2c mode reproduces karpathy/llama2.c run.c `sample()` bit for bit: steps 1-2 only (both are
// the identity when unused), then temperature 0 -> argmax; else logits[i] /= temperature (float
// division), run.c's float softmax in place (max, expf(x - max), float running sum, divide), one
// coin = Llama2cRng::next_f32() per step, then:
//   * top_p <= 0 or >= 1: the first i with coin < cdf_i (float running sum), else n - 1;
//   * otherwise run.c sample_topp: keep p >= (1 - top_p) / (n - 1), sort descending (stable, as
//     glibc's merge-sort qsort orders ties), cut at the first cumulative sum > top_p (else keep
//     all), r = coin * that sum, first kept index with r < cdf, else the last kept one.
// n is logits.size(): pass exactly the model's vocabulary. Afterwards `logits` holds the
// probabilities. The seed is run.c's rng_state; seed 0 or none means a random seed (as run.c
// does with -s 0). Penalties, top_k, min_p and typical_p must stay neutral in this mode.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generate/rng.h"
#include "kernels/row_sampling.h"

namespace exl {

enum class SamplerMode : uint8_t { default_, llama2c };
std::string to_string(SamplerMode m);
// "default" or "llama2c"; throws exl::Error naming the bad value.
SamplerMode parse_sampler_mode(std::string_view s);

// Plain settings; defaults are neutral (plain softmax sampling at temperature 1).
struct SamplerSettings {
  float temperature = 1.0f;         // >= 0; 0 = greedy
  int32_t top_k = 0;                // >= 0; 0 = off
  float top_p = 1.0f;               // [0, 1]; 0 or 1 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float typical_p = 1.0f;           // [0, 1]; 0 or 1 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float frequency_penalty = 0.0f;   // finite
  float presence_penalty = 0.0f;    // finite
  int32_t penalty_last_n = 64;      // history window; -1 = whole history, 0 = off
  std::map<int32_t, float> logit_bias;  // token -> additive bias (finite or -inf)
  std::optional<uint64_t> seed;     // none = drawn from std::random_device
  SamplerMode mode = SamplerMode::default_;
};

// Throws exl::Error ("engine: sampler: ...") naming the first invalid field. When vocab_size > 0
// also checks logit_bias ids against it.
void validate(const SamplerSettings& s, int64_t vocab_size = 0);

// Mask words needed for a vocabulary: bit (t % 32) of word t / 32 set = token t allowed.
inline size_t mask_words(size_t vocab_size) { return (vocab_size + 31) / 32; }

class Sampler {
 public:
  // Validates the settings (throws exl::Error) and seeds the RNG.
  explicit Sampler(SamplerSettings settings);

  // Samples one token from `logits` (modified in place, see above). `allowed_mask` is a bitset
  // over the vocabulary of at least mask_words(logits.size()) words; empty = all allowed.
  // Throws exl::Error when no token can be sampled (the mask and biases exclude every token),
  // when a logit is NaN, or when an input size is wrong. Does not add the token to the history.
  int32_t sample(std::span<float> logits, std::span<const uint32_t> allowed_mask = {});

  // Appends to the penalty history (prompt tokens and every sampled token). Negative ids throw.
  void accept(int32_t token);
  void accept(std::span<const int32_t> tokens);
  // Forgets the last n history tokens (speculative-decoding rollback); n > history size throws.
  void rollback(size_t n);

  struct TokenProb {
    int32_t token;
    float p;
  };
  // The final distribution of the last default-mode sample(): the tokens that survived every
  // filter with their renormalized probabilities, in the order the draw walked them. Greedy
  // gives the one chosen token with p = 1. Empty in llama2c mode and before the first sample.
  std::vector<TokenProb> last_distribution() const;

  // For sampling elsewhere (Backend::sample_rows) with this sampler's state: the uniform [0, 1)
  // that the next default-mode draw would use, consumed from the RNG stream (sample() consumes
  // one exactly when temperature > 0); and the distinct tokens of the penalty window with their
  // counts, sorted by id, empty when the penalties are off. Tokens >= vocab_size throw.
  double next_uniform() { return rng_.uniform(); }
  std::vector<TokenCount> penalty_counts(int64_t vocab_size) const;

  const SamplerSettings& settings() const { return settings_; }
  std::span<const int32_t> history() const { return history_; }
  // The seed actually used (the given one, or the one drawn when none was given).
  uint64_t seed() const { return seed_; }

 private:
  struct Candidate {
    float logit;
    float p;
    int32_t id;
  };

  void apply_bias_and_mask(std::span<float> logits, std::span<const uint32_t> mask) const;
  void apply_penalties(std::span<float> logits) const;
  int32_t sample_default(std::span<float> logits);
  int32_t sample_llama2c(std::span<float> logits);
  void keep_top_p();
  void keep_min_p();
  void keep_typical();
  int32_t draw();

  SamplerSettings settings_;
  uint64_t seed_ = 0;
  Xoshiro256 rng_{0};
  Llama2cRng llama2c_rng_{1};
  std::vector<int32_t> history_;
  std::vector<Candidate> cands_;  // scratch, reused across steps
  bool cands_are_distribution_ = false;
};

}  // namespace exl
