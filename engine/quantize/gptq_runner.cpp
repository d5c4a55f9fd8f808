#include "engine/quantize/gptq_runner.h"

#include "engine/quantize/gptq.h"
#include "kernels/error.h"
#include "kernels/gptq_device.h"

namespace exl {

struct GptqRunner::Plan {
  GptqPlan cpu;                              // the CPU path's plan (perm also on the device path)
  std::unique_ptr<GptqDeviceFactor> factor;  // the device path's
};

struct GptqRunner::Weight {
  int64_t out_features = 0, in_features = 0;
  std::span<const float> host;
  std::unique_ptr<GptqDeviceWeight> device;
};

GptqRunner::GptqRunner(ThreadPool& pool, GptqDevice* device) : pool_(pool), device_(device) {}
GptqRunner::~GptqRunner() = default;

std::shared_ptr<const GptqRunner::Plan> GptqRunner::plan(std::span<const float> x, int64_t dim,
                                                         double damp_fraction) const {
  EXL_CHECK(dim > 0 && x.size() % size_t(dim) == 0, "engine: quantize: gptq: ", x.size(),
            " input values for a linear of ", dim, " inputs");
  return make_plan(x.data(), int64_t(x.size()) / dim, dim, damp_fraction, false);
}

std::shared_ptr<const GptqRunner::Plan> GptqRunner::plan_resident(const float* x, int64_t rows, int64_t dim,
                                                                  double damp_fraction) const {
  EXL_CHECK(dim > 0 && rows >= 0, "engine: quantize: gptq: ", rows, " input rows for a linear of ", dim, " inputs");
  return make_plan(x, rows, dim, damp_fraction, device_ != nullptr);
}

std::shared_ptr<const GptqRunner::Plan> GptqRunner::make_plan(const float* x, int64_t rows, int64_t dim,
                                                              double damp_fraction, bool on_device) const {
  auto p = std::make_shared<Plan>();
  if (!device_) {
    Hessian h = make_hessian(dim);
    accumulate_hessian(h, x, rows, &pool_);
    p->cpu = plan_gptq(h, damp_fraction, &pool_);
    return p;
  }
  EXL_CHECK(rows > 0, "engine: quantize: gptq: no calibration rows reached this linear");
  auto h = device_->make_hessian(dim);
  if (on_device) device_->accumulate_resident(*h, x, rows);
  else device_->accumulate(*h, x, rows);
  GptqOrder order = gptq_order(device_->diag(*h), damp_fraction);
  double damp = order.damp;
  for (int attempt = 0; attempt < 10; ++attempt, damp *= 2) {
    p->factor = device_->factor(*h, order.perm, order.dead, damp);
    if (!p->factor) continue;
    p->cpu.dim = dim;
    p->cpu.perm = std::move(order.perm);
    p->cpu.dead = std::move(order.dead);
    p->cpu.damp = damp;
    return p;
  }
  fail("engine: quantize: gptq: the Hessian of dimension ", dim, " stays singular after damping up to ", damp,
       " (calibration inputs all zero or not finite?)");
}

std::span<const int32_t> GptqRunner::perm(const Plan& p) const { return p.cpu.perm; }

std::shared_ptr<const GptqRunner::Weight> GptqRunner::weight(std::span<const float> w, int64_t out_features,
                                                             int64_t in_features) const {
  EXL_CHECK(int64_t(w.size()) == out_features * in_features, "engine: quantize: gptq: weight of ", w.size(),
            " values for a ", out_features, "x", in_features, " layer");
  auto out = std::make_shared<Weight>();
  out->out_features = out_features;
  out->in_features = in_features;
  if (device_) out->device = device_->upload_weight(w, out_features, in_features);
  else out->host = w;
  return out;
}

Exl2Tensors GptqRunner::quantize(const Weight& w, const Plan& p, std::span<const std::pair<int, int64_t>> groups) const {
  const int64_t N = w.out_features, K = w.in_features;
  if (!device_) return gptq_quantize(w.host, N, K, p.cpu, groups, &pool_);
  EXL_CHECK(p.factor && p.cpu.dim == K, "engine: quantize: gptq: a plan of dimension ", p.cpu.dim, " for a ", N, "x",
            K, " layer");
  Exl2Tensors t = make_exl2_tensors(K, N, make_exl2_groups(groups, K), p.cpu.perm);
  GptqDeviceCodes c = device_->quantize(*w.device, *p.factor, t.groups);
  EXL_CHECK(c.q_weight.size() == t.q_weight.size() && c.q_scale.size() == t.q_scale.size() &&
                c.q_scale_max.size() == t.q_scale_max.size(),
            "engine: quantize: gptq: the device returned tensors of other sizes");
  t.q_weight = std::move(c.q_weight);
  t.q_scale = std::move(c.q_scale);
  t.q_scale_max = std::move(c.q_scale_max);
  return t;
}

}  // namespace exl
