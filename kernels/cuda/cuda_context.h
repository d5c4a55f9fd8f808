// Per-backend CUDA state shared by the host-side op implementations: the device, one stream, the
// cuBLAS handle, and growable scratch areas. Owned and used by one thread (the backend's).
// Host code only (.cpp). Every call that reaches the driver makes `device` current first.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/exl2_gemm.h"

namespace exl::cuda {

// Scratch areas; an op may use any of them, and the next op on the stream may reuse them.
enum class Scratch : int {
  act16,
  weights16,
  partials,
  gemv_partials,
  attn_kv,
  attn_scores,
  act16_lo,      // the exact linear path's split operands (cuda_linear.h)
  weights16_lo,
  weights32,
  handoff_a,  // act-order copies of activations handed from one op to the next (handoff.h)
  handoff_b,
  handoff_c,
  handoff_ssq,
  mma_staged,  // activations in tensor-core fragment order (exl2_mma_set)
  count
};

class CudaContext {
 public:
  explicit CudaContext(int device);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Elements of W dequantized to fp16 per cuBLAS call on the large-batch path of the quantized
  // linears; bounds the weights16 scratch (128 MiB by default; tests lower it).
  int64_t dequant_chunk_elems = int64_t(64) << 20;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  int sm_count() const { return sm_count_; }
  // The device's compute capability, major part (9 on the H100/H200).
  int compute_major() const { return compute_major_; }
  size_t max_shared_per_block() const { return max_smem_optin_; }
  size_t shared_per_sm() const { return smem_per_sm_; }
  // Whether kernels written for it may be launched overlapped with the stream's previous kernel
  // (programmatic dependent launch: compute capability 9.0 or newer, unless EXL_CUDA_PDL=0).
  bool overlapped_launches() const { return overlapped_launches_; }
  // How the tensor-core EXL2 kernel runs (exl2_mma_set): overlapped as overlapped_launches(); its
  // wgmma form where exl2_wgmma_available (an sm_90a device and binary) unless EXL_CUDA_WGMMA=0;
  // stream-K (Exl2MmaForm::stream_k) as EXL_CUDA_MMA_STREAM_K says (unset: 1, where
  // K-slices underfill: b=64 +6.7% on the H200, BENCHMARKS.md, session 31).
  Exl2MmaForm mma_form() const { return mma_form_; }

  void make_current() const;
  // Waits for everything queued on the stream (and frees staging buffers retired meanwhile).
  void sync();
  // A device allocation freed with cudaFree; zero bytes gives an empty Buffer.
  Buffer alloc(size_t bytes) const;
  // alloc() of memory that no recorded step graph reads or writes (the sampler's work areas):
  // generation() stays, so the graphs recorded so far stay valid.
  Buffer alloc_unrecorded(size_t bytes) const;
  // Page-locked host memory (freed with cudaFreeHost), for copies that must not wait for the stream.
  Buffer alloc_pinned(size_t bytes) const;
  // Copies host bytes to a new device allocation and waits for the copy.
  Buffer upload_new(const void* src, size_t bytes) const;
  template <typename T>
  Buffer upload_new(const std::vector<T>& v) const {
    return upload_new(v.data(), v.size() * sizeof(T));
  }
  // At least `bytes` bytes of scratch area `which`, valid until the next call for the same area
  // that must grow it; a call that need not returns the same area, contents kept (a chain of ops
  // hands data on through it: cuda_linear.h, run_layer_output_staged). Growing waits for the
  // stream, so that no queued kernel still reads the old area.
  void* scratch(Scratch which, size_t bytes);
  // At least `n` zeroed unsigned counters (for kernels that leave them zero again when they
  // finish); growing waits for the stream.
  unsigned* gemv_counters(size_t n);
  // Copies host `src` into a pinned host ring and queues its asynchronous copy into the device
  // ring (8 MiB, more for large arrays); returns the device address, valid for the kernels queued
  // next. The host memory may be reused as soon as this returns. An op may stage up to three
  // arrays. Wrapping around the ring waits for the stream (once per ring's worth of staged bytes),
  // so that no queued copy still reads a pinned slot; growing it waits too.
  const void* stage(const void* src, size_t bytes);
  template <typename T>
  const T* stage(const std::vector<T>& v) {
    return static_cast<const T*>(stage(v.data(), v.size() * sizeof(T)));
  }

  // Counts device allocations made through this context; a recorded step graph whose generation
  // differs may point at freed memory.
  uint64_t generation() const { return generation_; }
  // Counts device buffers of this context freed so far: after a free, an address a reader cached
  // (as a key) may name another buffer.
  uint64_t frees() const { return frees_->load(); }
  // Brackets one step that is recorded or captured into a graph (cuda_backend.cpp). Steps stage
  // into two pinned host rings in turn: begin_step switches to the other one, waits until the
  // work queued before the last switch away from it is done (not for the whole stream: the
  // previous step may still run, so that the host can record the next step meanwhile), and
  // restarts it at offset 0. Inside a step stage() only fills the pinned ring and returns an
  // address in the one device ring, so that the same staged arrays land at the same device
  // addresses every step, whichever host ring they came from; upload_staged() then queues one
  // copy of the step's bytes, ahead of the step's graph (graph launches and copies on the one
  // stream keep every step's device bytes apart). A `retry` (the same step issued again after a
  // pass that queued nothing) keeps the ring. Inside a step, staging the same host array (same
  // address, size and contents) again returns the first copy. While `capturing`, nothing waits
  // for the stream: a scratch area that must grow keeps the old one alive until the next sync().
  // end_step returns false when the step cannot be replayed (the ring wrapped or grew, or an area
  // grew while capturing).
  void begin_step(bool capturing, bool retry);
  bool end_step();
  // After end_step, before the step's graph is launched: queues the copy of the bytes the step
  // staged into the device ring.
  void upload_staged();

 private:
  struct Staged {
    const void* src;
    size_t bytes, offset;
  };
  void grow(Buffer& area, size_t bytes);
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int sm_count_ = 1;
  int compute_major_ = 0;
  size_t max_smem_optin_ = 48 * 1024;
  size_t smem_per_sm_ = 64 * 1024;
  bool overlapped_launches_ = false;
  Exl2MmaForm mma_form_;
  Buffer areas_[int(Scratch::count)];
  Buffer ring_;           // device, at least as large as either host ring
  Buffer host_ring_[2];  // pinned
  cudaEvent_t ring_free_[2] = {};
  int cur_ = 0;
  Buffer counters_;
  size_t ring_used_ = 0;
  std::vector<Buffer> retired_;
  mutable uint64_t generation_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> frees_ = std::make_shared<std::atomic<uint64_t>>(0);  // buffers may outlive *this
  bool in_step_ = false, capturing_ = false, step_ok_ = true, counters_zeroed_ = false;
  std::vector<Staged> staged_;  // this step's staged arrays
};

}  // namespace exl::cuda
