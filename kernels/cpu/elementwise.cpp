// Embedding lookup, RMSNorm, RoPE, SwiGLU and residual add on the CPU.
#include <cmath>
#include <vector>

#include "kernels/cpu/fp16_table.h"
#include "kernels/cpu/ops.h"
#include "kernels/half.h"

namespace exl::cpu {

void embedding(const EmbeddingWeights& e, std::span<const int32_t> ids, float* out) {
  const float* f16 = fp16_table();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t row = ids[i];
    float* o = out + int64_t(i) * e.dim;
    if (e.dtype == DType::f32) {
      const float* src = static_cast<const float*>(e.data) + row * e.dim;
      for (int64_t d = 0; d < e.dim; ++d) o[d] = src[d];
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(e.data) + row * e.dim;
      if (e.dtype == DType::f16)
        for (int64_t d = 0; d < e.dim; ++d) o[d] = f16[src[d]];
      else
        for (int64_t d = 0; d < e.dim; ++d) o[d] = bf16_to_float(src[d]);
    }
  }
}

void rms_norm(ThreadPool& tp, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  tp.parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double ss = 0;
      for (int64_t d = 0; d < dim; ++d) ss += double(xr[d]) * xr[d];
      const float inv = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
      for (int64_t d = 0; d < dim; ++d) yr[d] = w[d] * (xr[d] * inv);
    }
  });
}

void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
          const RopeTable& table) {
  const int half = head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = positions[size_t(r)];
    for (int i = 0; i < half; ++i) {
      const double a = pos * double(table.inv_freq[size_t(i)]);
      cs[size_t(i)] = float(std::cos(a) * table.attn_factor);
      sn[size_t(i)] = float(std::sin(a) * table.attn_factor);
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
        v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
      }
    }
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace exl::cpu
