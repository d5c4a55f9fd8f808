// Which accelerator, if any, this process can use. Safe to call from any thread, with or
// without the CUDA backend compiled in.
#pragma once
#include <string>

namespace exl {

// Number of usable CUDA devices; 0 when the CUDA backend is not compiled in or no driver/device.
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device 0, or a sentence saying why there is none.
std::string cuda_device_description();

}  // namespace exl
