#include "kernels/cpu/dequantize.h"

#include <algorithm>
#include <vector>

#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

float exl2_scale(const Exl2Matrix& m, int64_t group, int64_t n) {
  const uint32_t word = m.q_scale[group * (m.padded_out / 8) + n / 8];
  const uint32_t s = ((word >> (4 * (n % 8))) & 15u) + 1u;
  return float(s * s) * half_to_float(m.q_scale_max[group]) / 256.0f;
}

void dequantize(const Exl2Matrix& m, std::span<float> out) {
  const int64_t np = m.padded_out;
  dequantize_rows(m, out, 0, int64_t(out.size()) == np * m.in_features ? np : m.out_features);
}

void dequantize_rows(const Exl2Matrix& m, std::span<float> out, int64_t n_begin, int64_t n_end) {
  const int64_t k = m.in_features, np = m.padded_out;
  const int64_t n_rows = int64_t(out.size()) == np * k ? np : m.out_features;
  EXL_CHECK(int64_t(out.size()) == n_rows * k, "kernels: dequantize: exl2 output holds ", out.size(),
            " floats, expected ", m.out_features * k, " ([N, K]) or ", np * k, " ([Np, K])");
  EXL_CHECK(0 <= n_begin && n_begin <= n_end && n_end <= n_rows, "kernels: dequantize: rows [", n_begin, ", ", n_end,
            ") of ", n_rows);
  std::vector<float> scales(static_cast<size_t>(n_end - n_begin));
  for (int64_t g = 0; g < int64_t(m.groups.size()); ++g) {
    const Exl2Group& gr = m.groups[g];
    const int bits = gr.bits;
    const uint32_t mask = (1u << bits) - 1u;
    const float zero = float(1 << (bits - 1));
    for (int64_t n = n_begin; n < n_end; ++n) scales[size_t(n - n_begin)] = exl2_scale(m, g, n);
    for (int64_t j = 0; j < gr.rows; ++j) {
      const int64_t bit = j * bits;
      const int shift = int(bit % 32);
      const uint32_t* lo = m.q_weight + (gr.qrow_start + bit / 32) * np;
      const uint32_t* hi = shift + bits > 32 ? lo + np : nullptr;
      float* col = out.data() + m.perm[gr.row_start + j];
      for (int64_t n = n_begin; n < n_end; ++n) {
        uint32_t v = lo[n] >> shift;
        if (hi) v |= hi[n] << (32 - shift);
        col[n * k] = (float(v & mask) - zero) * scales[size_t(n - n_begin)];
      }
    }
  }
}

void dequantize(const GptqMatrix& m, std::span<float> out) {
  const int64_t k = m.in_features, n_out = m.out_features;
  EXL_CHECK(int64_t(out.size()) == n_out * k, "kernels: dequantize: gptq output holds ", out.size(),
            " floats, expected ", n_out * k, " ([N, K])");
  const uint32_t zero_offset = m.zeros_v2 ? 0u : 1u;
  for (int64_t row = 0; row < k; ++row) {
    const int64_t g = m.g_idx[row];
    const uint32_t* qw = m.qweight + (row / 8) * n_out;
    const uint32_t* qz = m.qzeros + g * (n_out / 8);
    const uint16_t* sc = m.scales + g * n_out;
    const int shift = int(4 * (row % 8));
    for (int64_t n = 0; n < n_out; ++n) {
      const uint32_t q = (qw[n] >> shift) & 15u;
      const uint32_t z = ((qz[n / 8] >> (4 * (n % 8))) & 15u) + zero_offset;
      out[n * k + row] = (float(q) - float(z)) * half_to_float(sc[n]);
    }
  }
}

void dequantize(const DenseMatrix& m, std::span<float> out) {
  const size_t count = size_t(m.out_features * m.in_features);
  EXL_CHECK(out.size() == count, "kernels: dequantize: dense output holds ", out.size(), " floats, expected ",
            count, " ([N, K])");
  switch (m.dtype) {
    case DType::f32: {
      const auto* p = static_cast<const float*>(m.data);
      std::copy(p, p + count, out.begin());
      return;
    }
    case DType::f16: {
      const auto* p = static_cast<const uint16_t*>(m.data);
      std::transform(p, p + count, out.begin(), half_to_float);
      return;
    }
    case DType::bf16: {
      const auto* p = static_cast<const uint16_t*>(m.data);
      std::transform(p, p + count, out.begin(), bf16_to_float);
      return;
    }
    default: fail("kernels: dequantize: dense matrix has unsupported dtype ", to_string(m.dtype));
  }
}

void dequantize(const LinearWeights& w, std::span<float> out) {
  std::visit([&](const auto& m) { dequantize(m, out); }, w);
}

}  // namespace exl
