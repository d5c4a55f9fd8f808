#include "kernels/cuda/cuda_context.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/exl2_gemm.h"
#include "kernels/env_switch.h"

namespace exl::cuda {

CudaContext::CudaContext(int device) : device_(device) {
  int n = 0;
  EXL_CUDA_CHECK(cudaGetDeviceCount(&n));
  EXL_CHECK(device >= 0 && device < n, "kernels: cuda: device ", device, " does not exist (", n, " CUDA devices)");
  make_current();
  EXL_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  int smem = 0;
  EXL_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  max_smem_optin_ = size_t(smem);
  EXL_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  smem_per_sm_ = size_t(smem);
  EXL_CUDA_CHECK(cudaDeviceGetAttribute(&compute_major_, cudaDevAttrComputeCapabilityMajor, device));
  overlapped_launches_ = compute_major_ >= 9 && !env_is("EXL_CUDA_PDL", "0");
  mma_form_ = {overlapped_launches_, !env_is("EXL_CUDA_WGMMA", "0") && exl2_wgmma_available(device)};
  mma_form_.stream_k = std::max(0, int(env_int("EXL_CUDA_MMA_STREAM_K", 1)));
  EXL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  EXL_CUBLAS_CHECK(cublasCreate(&cublas_));
  EXL_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  for (cudaEvent_t& e : ring_free_) {
    EXL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EXL_CUDA_CHECK(cudaEventRecord(e, stream_));
  }
}

CudaContext::~CudaContext() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& a : areas_) a.reset();
  ring_.reset();
  for (int r = 0; r < 2; ++r) {
    host_ring_[r].reset();
    if (ring_free_[r]) cudaEventDestroy(ring_free_[r]);
  }
  counters_.reset();
  retired_.clear();
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaContext::make_current() const { EXL_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaContext::sync() {
  make_current();
  EXL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  retired_.clear();
}

Buffer CudaContext::alloc_pinned(size_t bytes) const {
  make_current();
  void* h = nullptr;
  EXL_CUDA_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
  return Buffer(h, bytes, [](void* q) { cudaFreeHost(q); });
}

Buffer CudaContext::alloc(size_t bytes) const {
  if (bytes == 0) return {};
  ++generation_;
  return alloc_unrecorded(bytes);
}

Buffer CudaContext::alloc_unrecorded(size_t bytes) const {
  if (bytes == 0) return {};
  make_current();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("kernels: cuda: cannot allocate ", bytes, " bytes on device ", device_, " (", free_b, " of ", total_b,
         " bytes free): ", cudaGetErrorString(err));
  }
  const int dev = device_;
  return Buffer(p, bytes, [dev, frees = frees_](void* q) {
    cudaSetDevice(dev);
    cudaFree(q);
    ++*frees;
  });
}

Buffer CudaContext::upload_new(const void* src, size_t bytes) const {
  Buffer b = alloc(bytes);
  if (bytes) {
    EXL_CUDA_CHECK(cudaMemcpyAsync(b.data(), src, bytes, cudaMemcpyHostToDevice, stream_));
    EXL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return b;
}

void CudaContext::grow(Buffer& area, size_t bytes) {
  if (capturing_) {  // nodes captured earlier in this step use the old area: the graph is unusable
    retired_.push_back(std::move(area));
    step_ok_ = false;
  } else {
    sync();
    area.reset();
  }
  area = alloc(bytes);
}

void* CudaContext::scratch(Scratch which, size_t bytes) {
  Buffer& a = areas_[int(which)];
  if (a.bytes() < bytes || !a.data()) grow(a, std::max<size_t>(bytes + bytes / 4, 1 << 16));
  return a.data();
}

unsigned* CudaContext::gemv_counters(size_t n) {
  if (counters_.bytes() < n * sizeof(unsigned) || !counters_.data()) {
    grow(counters_, std::max<size_t>(n, 4096) * sizeof(unsigned));
    counters_zeroed_ = false;
  }
  if (!counters_zeroed_ && !capturing_) {  // a capture that grew them is dropped; the op-by-op rerun zeroes
    EXL_CUDA_CHECK(cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), stream_));
    counters_zeroed_ = true;
  }
  return static_cast<unsigned*>(counters_.data());
}

void CudaContext::begin_step(bool capturing, bool retry) {
  make_current();
  if (!retry) {  // a retry follows a pass that queued nothing: it restages into the same ring
    EXL_CUDA_CHECK(cudaEventRecord(ring_free_[cur_], stream_));
    cur_ ^= 1;
    EXL_CUDA_CHECK(cudaEventSynchronize(ring_free_[cur_]));
  }
  ring_used_ = 0;
  staged_.clear();
  in_step_ = true;
  capturing_ = capturing;
  step_ok_ = true;
}

bool CudaContext::end_step() {
  in_step_ = capturing_ = false;
  staged_.clear();
  return step_ok_;
}

void CudaContext::upload_staged() {
  make_current();
  if (ring_used_ > 0)
    EXL_CUDA_CHECK(cudaMemcpyAsync(ring_.data(), host_ring_[cur_].data(), ring_used_, cudaMemcpyHostToDevice, stream_));
}

const void* CudaContext::stage(const void* src, size_t bytes) {
  if (in_step_)
    for (const Staged& s : staged_)
      if (s.src == src && s.bytes == bytes && std::memcmp(static_cast<char*>(host_ring_[cur_].data()) + s.offset, src, bytes) == 0)
        return static_cast<char*>(ring_.data()) + s.offset;
  const size_t need = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (!host_ring_[cur_].data() || need * 4 > host_ring_[cur_].bytes()) {
    if (in_step_) step_ok_ = false;
    if (capturing_) retired_.push_back(std::move(host_ring_[cur_]));
    else sync();
    const size_t size = std::max<size_t>(need * 4, size_t(8) << 20);
    if (ring_.bytes() < size || !ring_.data()) grow(ring_, size);
    host_ring_[cur_] = alloc_pinned(size);
    ring_used_ = 0;
    staged_.clear();
  }
  if (ring_used_ + need > host_ring_[cur_].bytes()) {
    if (in_step_) step_ok_ = false;  // a replay would read overwritten slots
    else EXL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the pinned slots of the last lap are free again
    ring_used_ = 0;
    staged_.clear();
  }
  void* dst = static_cast<char*>(ring_.data()) + ring_used_;
  char* host = static_cast<char*>(host_ring_[cur_].data()) + ring_used_;
  if (in_step_) staged_.push_back({src, bytes, ring_used_});
  ring_used_ += need;
  if (bytes) {
    std::memcpy(host, src, bytes);
    if (!in_step_)  // a step's bytes go up in one copy before its graph runs (upload_staged)
      EXL_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  return dst;
}

}  // namespace exl::cuda
