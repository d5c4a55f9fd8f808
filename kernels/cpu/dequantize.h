// CPU reference dequantizers: every weight format to a float matrix W in HF orientation
// [out_features, in_features], row-major, in original input-feature order, so that y = x·Wᵀ.
// These are the oracle for every kernel; they favour clarity over speed. Bias is not part of W.
// Pure functions of their inputs; safe to call concurrently.
#pragma once
#include <cstdint>
#include <span>

#include "kernels/linear_weights.h"

namespace exl {

// EXL2 (exl2-engine.md §2): W[n, perm[j]] = (q[j, n] − 2^(b−1)) · scale[g(j), n] with
// scale = (s4 + 1)² · q_scale_max[g] / 256 computed in float (exact: the product fits a float).
// `out` holds either N·K floats, or padded_out·K floats to include the padding rows (which
// dequantize to 0 in converter-written files, whose padding columns hold the zero point).
void dequantize(const Exl2Matrix& m, std::span<float> out);
// Only rows [n_begin, n_end) of that `out` (disjoint ranges may run concurrently).
void dequantize_rows(const Exl2Matrix& m, std::span<float> out, int64_t n_begin, int64_t n_end);

// GPTQ: W[n, k] = (q[k, n] − zero[g_idx[k], n]) · scales[g_idx[k], n], zero = stored + 1 for the
// v1 convention and stored for v2. `out` holds N·K floats.
void dequantize(const GptqMatrix& m, std::span<float> out);

// Dense: W converted to float. `out` holds N·K floats.
void dequantize(const DenseMatrix& m, std::span<float> out);

// Dispatches on the format; `out` holds N·K floats.
void dequantize(const LinearWeights& w, std::span<float> out);

// The EXL2 scale of group `group`, output column `n`: (s4 + 1)² · q_scale_max[group] / 256.
float exl2_scale(const Exl2Matrix& m, int64_t group, int64_t n);

}  // namespace exl
