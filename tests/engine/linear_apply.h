// Random activations and one linear applied on a backend, for the engine tests that compare
// linears put together from slices (tensor parallelism, MLP order) with the linears as stored.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/linear_weights.h"

namespace exl::test {

// rows × k values in [−1, 1] from an xorshift of `seed`.
inline std::vector<float> random_rows(int64_t rows, int64_t k, uint32_t seed) {
  std::vector<float> x(size_t(rows * k));
  for (float& v : x) {
    seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
    v = float(int(seed % 2001) - 1000) / 1000.0f;
  }
  return x;
}

// y [rows, out] = x · Wᵀ on `be`.
inline std::vector<float> apply(Backend& be, const LinearWeights& w, const std::vector<float>& x, int64_t rows) {
  auto p = be.prepare_linear(w);
  Buffer bx = be.alloc(x.size() * 4), by = be.alloc(size_t(rows * out_features(w)) * 4);
  be.upload(bx.data(), x.data(), x.size() * 4);
  be.linear(*p, bx.f32(), by.f32(), rows);
  std::vector<float> y(size_t(rows * out_features(w)));
  be.download(y.data(), by.data(), y.size() * 4);
  return y;
}

}  // namespace exl::test
