// The device GPTQ's entry point in a build without CUDA (the real one is kernels/cuda/gptq_device.cpp).
#ifndef EXL_HAVE_CUDA
#include "kernels/error.h"
#include "kernels/gptq_device.h"

namespace exl {

std::unique_ptr<GptqDevice> make_cuda_gptq_device(int) { fail("kernels: cuda: this build has no CUDA (device GPTQ)"); }

}  // namespace exl
#endif
