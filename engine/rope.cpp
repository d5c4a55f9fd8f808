#include "engine/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace exl {

namespace {

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double yarn_correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& r, int head_dim, int64_t max_position_embeddings) {
  const int half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = 1.0 / std::pow(r.theta, double(2 * i) / head_dim);
  RopeTable t;
  switch (r.type) {
    case RopeType::default_: break;
    case RopeType::linear:
      for (double& f : inv) f /= r.factor;
      break;
    case RopeType::llama3: {
      const double old_ctx = double(r.original_max_position_embeddings);
      const double low_wavelen = old_ctx / r.low_freq_factor, high_wavelen = old_ctx / r.high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          f /= r.factor;
        } else {
          const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1.0 - smooth) * f / r.factor + smooth * f;
        }
      }
      break;
    }
    case RopeType::yarn: {
      const double orig = r.original_max_position_embeddings > 0 ? double(r.original_max_position_embeddings)
                                                                   : double(max_position_embeddings);
      double attn = 1.0;
      if (r.attention_factor) attn = *r.attention_factor;
      else if (r.mscale && r.mscale_all_dim)
        attn = yarn_mscale(r.factor, *r.mscale) / yarn_mscale(r.factor, *r.mscale_all_dim);
      else attn = yarn_mscale(r.factor, 1.0);
      double low = std::floor(yarn_correction_dim(r.beta_fast, head_dim, r.theta, orig));
      double high = std::ceil(yarn_correction_dim(r.beta_slow, head_dim, r.theta, orig));
      low = std::max(low, 0.0);
      high = std::min(high, double(head_dim - 1));
      if (low == high) high += 0.001;
      for (int i = 0; i < half; ++i) {
        const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        const double extrap_factor = 1.0 - ramp;
        const double f = inv[size_t(i)];
        inv[size_t(i)] = (f / r.factor) * (1.0 - extrap_factor) + f * extrap_factor;
      }
      t.attn_factor = float(attn);
      break;
    }
  }
  t.inv_freq.assign(inv.begin(), inv.end());
  return t;
}

}  // namespace exl
