// Picks a backend by the --backend flag's value ("cpu", "cuda"); throws exl::Error when the
// requested backend is not available in this build or on this machine.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace exl {

std::unique_ptr<Backend> make_backend(const std::string& name, int cpu_threads = 0);
// The cache format used when --cache is not given: exact f32 on the CPU, fp16 on CUDA.
KvFormat default_cache_format(const std::string& backend);

}  // namespace exl
