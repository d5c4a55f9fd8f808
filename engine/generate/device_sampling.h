// The bridge between a job's Sampler (engine/generate/sampler.h) and Backend::sample_rows
// (kernels/row_sampling.h): which settings a backend can sample, the per-row inputs built from
// the sampler's state, the errors for sample_rows' failure codes, and a host reference of what
// sample_rows must return. Plain functions; the Sampler passed in is the job's (engine thread).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/generate/sampler.h"
#include "kernels/row_sampling.h"

namespace exl {

// Whether Backend::sample_rows can sample with these settings: the default mode without
// typical_p (typical_p and llama2c sample on the host).
bool device_samplable(const SamplerSettings& s);

// One row's inputs, owning what RowSampling's spans point at.
struct DeviceRow {
  RowSampling params;  // spans empty here; view() fills them
  std::vector<TokenCount> penalties;
  std::vector<TokenBias> bias;
  std::vector<uint32_t> mask;
  RowSampling view() const;
};

// The inputs for sampling `sampler`'s next token from logits row `row` of a vocabulary of
// `vocab` tokens, with `mask` (empty = all allowed, else mask_words(vocab) words). Consumes one
// uniform from the sampler's RNG when temperature > 0, as Sampler::sample would, so a job's
// random stream is the same whichever side samples. Throws exl::Error for settings that are
// not device_samplable and for a mask of the wrong size.
DeviceRow make_device_row(Sampler& sampler, int64_t vocab, int64_t row, std::vector<uint32_t> mask);

// The token for a sample_rows result; throws the exl::Error Sampler::sample throws for the
// failure codes (and for an id outside the vocabulary).
int32_t checked_sampled_token(int32_t result, int64_t vocab);

// The host reference of sample_rows for one row: Sampler::sample's choice for these inputs and
// this u (what a correct backend returns, up to the float summation order: sampling.cu).
int32_t reference_sample_row(std::span<const float> logits, const RowSampling& row);

// The multinomial draw of Sampler::sample over a final distribution (Sampler::last_distribution)
// with the uniform u: the first token whose cumulative probability exceeds u · total.
int32_t draw_from(std::span<const Sampler::TokenProb> dist, double u);

}  // namespace exl
