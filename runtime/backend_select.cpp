#include "runtime/backend_select.h"

#include <charconv>

#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
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

GpuSplit parse_gpu_split(const std::string& text, const std::string& backend) {
  GpuSplit s;
  if (text == "auto") {
    EXL_CHECK(backend == "cuda", "runtime: --gpu-split auto needs --backend cuda (a CPU split names its shares: "
                                 "--gpu-split 1,1)");
    s.n_devices = cuda_device_count();
    EXL_CHECK(s.n_devices > 0, "runtime: --gpu-split auto: ", cuda_device_description());
    return s;
  }
  size_t b = 0;
  for (;;) {
    const size_t e = std::min(text.find(',', b), text.size());
    const std::string item = text.substr(b, e - b);
    double gb = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), gb);
    EXL_CHECK(ec == std::errc() && ptr == item.data() + item.size() && gb > 0 && gb < 1e6,
              "runtime: --gpu-split '", text, "': '", item,
              "' is not a positive number of GB (expected GB per device, e.g. 20,24, or auto)");
    s.gb.push_back(gb);
    if (e == text.size()) break;
    b = e + 1;
  }
  s.n_devices = int(s.gb.size());
  return s;
}

std::vector<std::unique_ptr<Backend>> make_split_backends(const std::string& name, const GpuSplit& split,
                                                          int cpu_threads, std::string_view flag) {
  EXL_CHECK(split.n_devices > 0, "runtime: ", flag, " names no device");
  std::vector<std::unique_ptr<Backend>> out;
  if (name == "cuda") {
    const int have = cuda_device_count();
    EXL_CHECK(split.n_devices <= have, "runtime: ", flag, " names ", split.n_devices, " devices but this machine has ",
              have, have == 1 ? " CUDA device" : " CUDA devices", have == 0 ? cat(" (", cuda_device_description(), ")") : "");
    for (int d = 0; d < split.n_devices; ++d) out.push_back(make_cuda_backend(d));
    return out;
  }
  for (int d = 0; d < split.n_devices; ++d) out.push_back(make_backend(name, cpu_threads));
  return out;
}

std::vector<std::optional<DeviceMemory>> device_memories(const std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<std::optional<DeviceMemory>> m;
  for (const auto& b : backends) m.push_back(b->device_memory());
  return m;
}

}  // namespace exl
