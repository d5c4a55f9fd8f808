// GPTQ's heavy parts on a device, for the converter (engine/quantize/gptq_runner.h); the CPU
// reference and the algorithm are engine/quantize/gptq.h, and every step here computes what the
// reference computes, in the precision stated:
//   - Hessian: H += 2·XᵀX of host rows, uploaded in chunks of kGptqHessianChunkRows; each chunk's
//     XᵀX is one cuBLAS SSYRK (fp32 accumulation over the chunk, no TF32), added into a double H
//     (the reference sums 128 rows in fp32, then in double);
//   - factor: the act-ordered, damped H (order and damping decided by the caller from diag()),
//     its Cholesky (blocked: 128-wide diagonal blocks on the host, panels by cuBLAS DTRSM and
//     DSYRK) and the triangular inverse (DTRSM), in double, giving U, the upper factor of
//     (H + λI)⁻¹ in permuted order, as fp32, as the reference does;
//   - quantize: per group the scale search (exactly the reference's arithmetic; the 16 candidate
//     errors summed in double in a fixed order, so ties may break differently), the group's rows
//     quantized one by one with the error fed to its later rows (the reference's fp32 operations in
//     its order, no FMA contraction), and the rows after the group updated by one cuBLAS SGEMM
//     (fp32, a different summation order than the reference's loop: results agree to fp32 rounding,
//     so a code near a rounding boundary may differ, and its error feedback with it).
// A GptqDevice owns its stream and cuBLAS handle; each call returns when its work is done. One
// thread at a time; objects it made must be used with it only.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/linear_weights.h"

namespace exl {

inline constexpr int64_t kGptqHessianChunkRows = 2048;

// Σ 2·xᵀx in device memory, double, [dim, dim] (upper triangle kept).
class GptqDeviceHessian {
 public:
  virtual ~GptqDeviceHessian() = default;
  int64_t dim = 0;
  int64_t rows = 0;  // input rows accumulated
};

// U [dim, dim] (fp32, upper, permuted order), the permutation and the dead rows, in device memory.
class GptqDeviceFactor {
 public:
  virtual ~GptqDeviceFactor() = default;
  int64_t dim = 0;
};

// A dense weight W [N, K] (HF orientation) in device memory, fp32.
class GptqDeviceWeight {
 public:
  virtual ~GptqDeviceWeight() = default;
  int64_t out_features = 0, in_features = 0;
};

// One quantized linear's EXL2 words, laid out as exl2_writer.h's Exl2Tensors holds them.
struct GptqDeviceCodes {
  std::vector<uint32_t> q_weight;     // [q_rows, padded_out]
  std::vector<uint32_t> q_scale;      // [groups, padded_out / 8]
  std::vector<uint16_t> q_scale_max;  // [groups] fp16 bits
};

class GptqDevice {
 public:
  virtual ~GptqDevice() = default;

  virtual std::unique_ptr<GptqDeviceHessian> make_hessian(int64_t dim) = 0;
  // Adds 2·xᵀx for host rows x [rows, dim] (row-major).
  virtual void accumulate(GptqDeviceHessian& h, const float* x, int64_t rows) = 0;
  // The same for rows already in this device's memory (written by other streams of the process,
  // whose work must be complete): no upload, the same chunks and arithmetic.
  virtual void accumulate_resident(GptqDeviceHessian& h, const float* x_device, int64_t rows) = 0;
  // diag(H) [dim].
  virtual std::vector<double> diag(const GptqDeviceHessian& h) = 0;
  // The factor of (P·H·Pᵀ + damp·I)⁻¹ with permuted row j = input feature perm[j]; dead features
  // (by feature index, 0/1) get H's row and column zeroed and 1 on the diagonal before damping.
  // nullptr when the damped matrix is not numerically positive definite or U is not finite
  // (the caller raises the damping).
  virtual std::unique_ptr<GptqDeviceFactor> factor(const GptqDeviceHessian& h, std::span<const int32_t> perm,
                                                   std::span<const uint8_t> dead, double damp) = 0;
  // U [dim, dim] row-major as host floats (tests).
  virtual std::vector<float> factor_u(const GptqDeviceFactor& f) = 0;
  // w [N, K] row-major host floats.
  virtual std::unique_ptr<GptqDeviceWeight> upload_weight(std::span<const float> w, int64_t out_features,
                                                          int64_t in_features) = 0;
  // W quantized in the factor's order into `groups` (Exl2Group rows, bits and qrow_start as
  // make_exl2_groups gives them; q_rows = Σ rows·bits/32, padded_out = N rounded up to 32);
  // weights of dead features are stored as 0, padding columns as the zero point. Throws exl::Error
  // when a group's maximum leaves the fp16 range.
  virtual GptqDeviceCodes quantize(const GptqDeviceWeight& w, const GptqDeviceFactor& f,
                                   std::span<const Exl2Group> groups) = 0;
};

// A GptqDevice on CUDA device `device`. Throws exl::Error when the build has no CUDA or the device
// does not exist (kernels/cuda/gptq_device.cpp; kernels/cuda_backend_stub.cpp without CUDA).
std::unique_ptr<GptqDevice> make_cuda_gptq_device(int device = 0);

}  // namespace exl
