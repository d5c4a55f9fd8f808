// Helpers of the engine's GPU tests: skipping without a CUDA device, and stories260K loaded on
// device 0 with its tokenizer.
#pragma once
#include <memory>

#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "test_support.h"

#define EXL_REQUIRE_CUDA() \
  if (exl::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << exl::cuda_device_description()

namespace exl::test {

// stories260K (../shared/models/stories260K-hf) on a fresh CUDA backend of device 0. Members in
// dependency order: the model refers to dir and gpu.
struct CudaStories {
  ModelDir dir{shared_dir() / "models/stories260K-hf"};
  std::unique_ptr<Tokenizer> tok = load_tokenizer(dir.path());
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  Model model{dir, *gpu};
};

}  // namespace exl::test
