// GPTQ (Frantar et al., 2022) for EXL2 layouts: one linear's weights quantized group by group in
// act-order with error feedback through the Hessian H = 2·XᵀX of its real inputs, as ExLlamaV2's
// converter does (exl2-engine.md §8.3): act-order by descending diag(H) (written as the EXL2
// permutation, q_invperm), damping added to the diagonal, the upper Cholesky factor U of H⁻¹,
// then per group: the scales fitted on the group's error-compensated rows (quantize_linear.h),
// each row quantized as inference dequantizes it and its error pushed onto the group's later rows,
// the rows after the group updated in one lazy batch (W[b:] −= U[a:b, b:]ᵀ·E).
//
// This is the CPU reference. Its three parts (accumulate_hessian, plan_gptq, gptq_quantize) are
// pure functions over host arrays, shaped so that a device path (a GEMM for the Hessian, a
// Cholesky solver for the plan, the lazy updates as GEMMs) can replace each one behind the
// backend interface. Safe to call concurrently on different data.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/formats/exl2_writer.h"

namespace exl {

class ThreadPool;

// Σ 2·xᵀx over the input rows seen so far, accumulated in double (fp32 accumulation loses the
// small eigenvalues that the Cholesky needs once rows reach the thousands).
struct Hessian {
  int64_t dim = 0;
  int64_t rows = 0;        // input rows accumulated
  std::vector<double> h;   // [dim, dim], symmetric
};

Hessian make_hessian(int64_t dim);
// Adds 2·xᵀx for x [rows, dim] (row-major). pool, when given, splits the work by output rows.
void accumulate_hessian(Hessian& h, const float* x, int64_t rows, ThreadPool* pool = nullptr);

// What every layout of one linear shares: the act-order and the factor of the damped inverse.
struct GptqPlan {
  int64_t dim = 0;
  std::vector<int32_t> perm;   // permuted row j holds input feature perm[j] (diag(H) descending)
  std::vector<uint8_t> dead;   // [dim] by input feature: never seen a non-zero input (weights zeroed)
  std::vector<float> u;        // [dim, dim] permuted order, upper Cholesky factor of (H + λI)⁻¹
  double damp = 0;             // λ actually used
};

// The act-order (input features by descending diag(H), ties by index), the dead features
// (diag ≤ 0) and the first damping λ = max(damp_fraction · Σ live diag / dim, 1e-10) (a mean of 0
// counts as 1): what plan_gptq and the device path (gptq_runner.h) both start from.
struct GptqOrder {
  std::vector<int32_t> perm;
  std::vector<uint8_t> dead;
  double damp = 0;
};
GptqOrder gptq_order(std::span<const double> diag, double damp_fraction);

// damp_fraction · mean(diag H) is added to the diagonal (ExLlamaV2 uses 0.12; GPTQ's paper 0.01);
// when the factorization fails the damping is doubled, up to 10 times. Throws exl::Error
// ("engine: quantize: gptq: ...") when it still fails or H is empty.
GptqPlan plan_gptq(const Hessian& h, double damp_fraction, ThreadPool* pool = nullptr);

// W [N, K] (HF orientation) quantized with the plan's permutation into `groups` ((bits, rows) in
// permuted-row order, as option_groups gives). Weights of dead features are stored as 0.
Exl2Tensors gptq_quantize(std::span<const float> w, int64_t out_features, int64_t in_features, const GptqPlan& plan,
                          std::span<const std::pair<int, int64_t>> groups, ThreadPool* pool = nullptr);

}  // namespace exl
