// GPTQ for the converter on the CPU reference (gptq.h) or on a GptqDevice (kernels/gptq_device.h),
// behind one interface, so that quantize_model runs the same steps on either: a plan per linear
// input (act-order and damping from gptq_order; the damping doubled, up to 10 times, until the
// factorization succeeds, as plan_gptq does), a dense weight held across the layouts measured for
// it (uploaded once on the device), and a layout's EXL2 tensors. The device path's results agree
// with the CPU's to fp32 rounding (kernels/gptq_device.h says where they may differ). Not
// thread-safe (one device, one thread); the CPU path parallelizes inside over `pool`.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "engine/formats/exl2_writer.h"

namespace exl {

class GptqDevice;
class ThreadPool;

class GptqRunner {
 public:
  struct Plan;    // one linear input's act-order and factor
  struct Weight;  // W [N, K] fp32

  // device null: the CPU reference.
  GptqRunner(ThreadPool& pool, GptqDevice* device);
  ~GptqRunner();
  bool on_device() const { return device_ != nullptr; }

  // The plan of a linear from its input rows x [rows, dim] (host, row-major): the Hessian
  // Σ 2·xᵀx (streamed to the device in chunks), act-order, damped factor. Throws exl::Error
  // ("engine: quantize: gptq: ...") for no rows or a Hessian that stays singular.
  std::shared_ptr<const Plan> plan(std::span<const float> x, int64_t dim, double damp_fraction) const;
  // The same for x [rows, dim] in the memory of the backend the converter runs on: the device's
  // when on_device() (complete, not uploaded again), host memory otherwise.
  std::shared_ptr<const Plan> plan_resident(const float* x, int64_t rows, int64_t dim, double damp_fraction) const;
  // The permutation of a plan (permuted row j = input feature perm[j]).
  std::span<const int32_t> perm(const Plan& p) const;
  // w [N, K] host floats; on the CPU the Weight refers to `w`, which must outlive it.
  std::shared_ptr<const Weight> weight(std::span<const float> w, int64_t out_features, int64_t in_features) const;
  // W quantized with the plan into `groups` ((bits, rows) in permuted-row order, as option_groups
  // gives); what gptq_quantize returns.
  Exl2Tensors quantize(const Weight& w, const Plan& p, std::span<const std::pair<int, int64_t>> groups) const;

 private:
  std::shared_ptr<const Plan> make_plan(const float* x, int64_t rows, int64_t dim, double damp_fraction,
                                        bool on_device) const;
  ThreadPool& pool_;
  GptqDevice* device_;
};

}  // namespace exl
