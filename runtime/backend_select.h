// Picks a backend by the --backend flag's value ("cpu", "cuda"), and the backends of a model split
// by layers (--gpu-split); throws exl::Error when the requested backend is not available in this
// build or on this machine.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/layer_split.h"
#include "kernels/backend.h"

namespace exl {

std::unique_ptr<Backend> make_backend(const std::string& name, int cpu_threads = 0);
// The cache format used when --cache is not given: exact f32 on the CPU, fp16 on CUDA.
KvFormat default_cache_format(const std::string& backend);

// The --gpu-split value for `backend`: "20,24" (GB per device, in device order) or "auto" (every
// CUDA device, up to its free memory; cuda only). Throws exl::Error naming the bad value.
GpuSplit parse_gpu_split(const std::string& text, const std::string& backend);
// One backend per device of the split: CUDA devices 0..n-1 (throws when the machine has fewer:
// "runtime: --gpu-split names 2 devices but this machine has 1 CUDA device"), or n CPU backends of
// `cpu_threads` threads each (a CPU split runs the split code path, for tests).
// `flag` names the option in that error (--tensor-parallel uses this too).
std::vector<std::unique_ptr<Backend>> make_split_backends(const std::string& name, const GpuSplit& split,
                                                          int cpu_threads = 0, std::string_view flag = "--gpu-split");
// The memory of each backend's device, in order (Backend::device_memory).
std::vector<std::optional<DeviceMemory>> device_memories(const std::vector<std::unique_ptr<Backend>>& backends);

}  // namespace exl
