#include "engine/quantize/quantize_linear.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

namespace {

constexpr int kGridPoints = 16;

// Scale codes, fp16 maximum and error of one group's best fit.
struct GroupFit {
  std::vector<uint32_t> qscale;  // [N], in [1, 16]
  uint16_t smax = 0;             // fp16 bits
  double error = 0;
};

// Squared error of rows × N values x at per-column scales; writes codes when `codes` is given.
double quantize_rows(const float* x, int64_t rows, int64_t n_cols, int bits, std::span<const float> scale,
                     std::span<const float> inv, uint8_t* codes) {
  const float maxq = float((1 << bits) - 1), zero = float(1 << (bits - 1));
  double err = 0;
  for (int64_t j = 0; j < rows; ++j) {
    const float* r = x + j * n_cols;
    float e = 0;
    for (int64_t n = 0; n < n_cols; ++n) {
      const float q = std::clamp(std::nearbyint(r[n] * inv[n]) + zero, 0.0f, maxq);
      const float d = r[n] - (q - zero) * scale[n];
      e += d * d;
      if (codes) codes[j * n_cols + n] = uint8_t(q);
    }
    err += double(e);
  }
  return err;
}

void scales_for(const GroupFit& f, float smax, std::vector<float>& scale, std::vector<float>& inv) {
  for (size_t n = 0; n < f.qscale.size(); ++n) {
    scale[n] = float(f.qscale[n] * f.qscale[n]) * smax / 256.0f;
    inv[n] = scale[n] > 0 ? 1.0f / scale[n] : 0.0f;
  }
}

GroupFit fit_group(const float* x, int64_t rows, int64_t n_cols, int bits) {
  GroupFit f;
  std::vector<float> base(size_t(n_cols), 0.0f);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t n = 0; n < n_cols; ++n) base[n] = std::max(base[n], std::fabs(x[j * n_cols + n]));
  const float half_range = float((1 << bits) - 1) / 2.0f;
  float smax0 = 0;
  for (auto& b : base) smax0 = std::max(smax0, b /= half_range);
  f.qscale.assign(size_t(n_cols), 1);
  std::vector<float> scale(static_cast<size_t>(n_cols)), inv(static_cast<size_t>(n_cols));
  if (!(smax0 > 0)) {
    scales_for(f, 0.0f, scale, inv);
    f.error = quantize_rows(x, rows, n_cols, bits, scale, inv, nullptr);
    return f;
  }
  for (int64_t n = 0; n < n_cols; ++n)
    f.qscale[n] = uint32_t(std::clamp(std::lround(std::sqrt(base[n] / smax0) * 16.0f), 1L, 16L));
  f.error = INFINITY;
  for (int i = 0; i < kGridPoints; ++i) {
    const float p = 0.70f + 0.50f * float(i) / float(kGridPoints - 1);
    const uint16_t h = float_to_half(smax0 * p);
    const float s = half_to_float(h);
    if (!std::isfinite(s)) continue;
    scales_for(f, s, scale, inv);
    const double e = quantize_rows(x, rows, n_cols, bits, scale, inv, nullptr);
    if (e < f.error) f.error = e, f.smax = h;
  }
  EXL_CHECK(std::isfinite(f.error), "engine: quantize: group maximum ", smax0,
            " is outside the fp16 range (weights too large for EXL2 scales)");
  return f;
}

}  // namespace

QuantOption head_quant_option(int head_bits) {
  switch (head_bits) {
    case 2: return {{4, 0.3, 32}, {2, 0.7, 32}};
    case 3: return {{4, 0.15, 32}, {3, 0.85, 32}};
    case 4: return {{6, 0.15, 32}, {4, 0.85, 32}};
    case 5: return {{6, 0.15, 128}, {5, 0.85, 128}};
    case 6: return {{8, 0.15, 128}, {6, 0.85, 128}};
    case 8: return {{8, 1.0, 128}};
    default: fail("engine: quantize: --head-bits must be 2, 3, 4, 5, 6 or 8, got ", head_bits);
  }
}

std::string to_string(const QuantOption& o) {
  std::ostringstream s;
  for (size_t i = 0; i < o.size(); ++i) {
    if (i) s << ",";
    s << o[i].bits;
    if (o[i].fraction < 1.0) s << ":" << o[i].fraction;
    s << "@" << o[i].group_size;
  }
  return s.str();
}

std::vector<std::pair<int, int64_t>> option_groups(const QuantOption& o, int64_t in_features) {
  EXL_CHECK(in_features > 0 && in_features % 32 == 0, "engine: quantize: in_features ", in_features,
            " is not a positive multiple of 32, which EXL2 groups require");
  std::vector<std::pair<int, int64_t>> out;
  int64_t remaining = in_features;
  for (size_t i = 0; i < o.size() && remaining > 0; ++i) {
    const auto& s = o[i];
    const bool last = i + 1 == o.size();
    const double want = last ? double(remaining) : std::min(double(in_features) * s.fraction, double(remaining));
    const int64_t groups = int64_t(std::ceil(want / double(s.group_size) - 1e-9));
    for (int64_t g = 0; g < groups && remaining > 0; ++g) {
      const int64_t rows = std::min(s.group_size, remaining);
      out.push_back({s.bits, rows});
      remaining -= rows;
    }
  }
  return out;
}

int64_t exl2_storage_bits(std::span<const std::pair<int, int64_t>> groups, int64_t in_features,
                          int64_t out_features) {
  const int64_t np = (out_features + 31) / 32 * 32, g = int64_t(groups.size());
  int64_t qrows = 0;
  for (auto [bits, rows] : groups) qrows += rows * bits / 32;
  return 32 * qrows * np + g * np * 4 + 48 * g + 32 * in_features;
}

std::vector<int32_t> saliency_order(std::span<const float> w, int64_t out_features, int64_t in_features) {
  std::vector<double> s(size_t(in_features), 0.0);
  for (int64_t n = 0; n < out_features; ++n)
    for (int64_t k = 0; k < in_features; ++k) s[k] += double(w[n * in_features + k]) * w[n * in_features + k];
  std::vector<int32_t> perm(static_cast<size_t>(in_features));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  return perm;
}

std::vector<float> permuted_rows(std::span<const float> w, int64_t out_features, int64_t in_features,
                                 std::span<const int32_t> perm) {
  std::vector<float> out(size_t(in_features * out_features));
  for (int64_t n = 0; n < out_features; ++n)
    for (int64_t j = 0; j < in_features; ++j) out[j * out_features + n] = w[n * in_features + perm[j]];
  return out;
}

GroupScales fit_group_scales(const float* rows_data, int64_t rows, int64_t n_cols, int bits) {
  const GroupFit f = fit_group(rows_data, rows, n_cols, bits);
  GroupScales g{f.qscale, f.smax, std::vector<float>(size_t(n_cols)), std::vector<float>(size_t(n_cols))};
  scales_for(f, half_to_float(f.smax), g.scale, g.inv);
  return g;
}

Exl2Tensors quantize_exl2(std::span<const float> w, int64_t out_features, int64_t in_features,
                          std::vector<int32_t> perm, std::span<const std::pair<int, int64_t>> groups,
                          double* sq_error) {
  EXL_CHECK(int64_t(w.size()) == out_features * in_features, "engine: quantize: weight holds ", w.size(),
            " values, expected ", out_features, "x", in_features);
  const std::vector<float> rows = permuted_rows(w, out_features, in_features, perm);
  Exl2Tensors t = make_exl2_tensors(in_features, out_features, make_exl2_groups(groups, in_features), std::move(perm));
  std::vector<float> scale(static_cast<size_t>(out_features)), inv(static_cast<size_t>(out_features));
  std::vector<uint8_t> codes;
  double total = 0;
  for (size_t g = 0; g < t.groups.size(); ++g) {
    const Exl2Group& gr = t.groups[g];
    const float* x = rows.data() + gr.row_start * out_features;
    const GroupFit f = fit_group(x, gr.rows, out_features, gr.bits);
    scales_for(f, half_to_float(f.smax), scale, inv);
    codes.assign(size_t(gr.rows * out_features), 0);
    total += quantize_rows(x, gr.rows, out_features, gr.bits, scale, inv, codes.data());
    t.q_scale_max[g] = f.smax;
    for (int64_t n = 0; n < out_features; ++n) set_scale_code(t, g, n, f.qscale[n] - 1);
    for (int64_t j = 0; j < gr.rows; ++j)
      for (int64_t n = 0; n < out_features; ++n) set_code(t, g, j, n, codes[j * out_features + n]);
  }
  if (sq_error) *sq_error += total;
  return t;
}

}  // namespace exl
