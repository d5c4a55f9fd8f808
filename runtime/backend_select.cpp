#include "runtime/backend_select.h"

#include "kernels/cuda_backend.h"
#include "kernels/error.h"

namespace exl {

std::unique_ptr<Backend> make_backend(const std::string& name, int cpu_threads) {
  if (name == "cpu") return make_cpu_backend(cpu_threads);
  if (name == "cuda") return make_cuda_backend(0);
  fail("runtime: unknown backend '", name, "' (expected cpu or cuda)");
}

KvFormat default_cache_format(const std::string& backend) {
  return backend == "cpu" ? KvFormat::f32 : KvFormat::fp16;
}

}  // namespace exl
