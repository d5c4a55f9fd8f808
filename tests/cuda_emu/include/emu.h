// CPU emulation of the CUDA subset used by kernels/cuda/ (see ../Makefile), for checking kernel
// logic without a GPU. Blocks run one at a time; the threads of a block are cooperative fibers
// (ucontext + _setjmp); __syncthreads, __syncwarp and shuffles are barriers among live threads.
// Device memory is host memory; cuBLAS GEMMs are naive loops that validate their arguments.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "kernels/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct float4 {
  float x, y, z, w;
};

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100
} cudaError_t;
typedef struct CUstream_st* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#define cudaStreamNonBlocking 1
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
};

struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};
inline float __half2float(__half h) { return exl::half_to_float(h.x); }
inline __half __float2half_rn(float f) { return {exl::float_to_half(f)}; }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {exl::float_to_bf16(f)}; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % (sizeof(T) < 16 ? sizeof(T) : 16) != 0) {
    std::fprintf(stderr, "emu: misaligned %zu-byte load at %p\n", sizeof(T), static_cast<const void*>(p));
    std::abort();
  }
  return *p;
}
inline float atomicAdd(float* p, float v) {
  const float o = *p;
  *p = o + v;
  return o;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace emu {

struct Fiber {
  ucontext_t uc;
  jmp_buf jb;
  char* stack = nullptr;
  dim3 tidx;
  unsigned lin = 0;
  bool started = false, done = false;
};

inline constexpr size_t k_stack = 256 * 1024;
inline jmp_buf sched_jb;
inline std::vector<Fiber> fibers;
inline Fiber* cur = nullptr;
inline dim3 grid_dim, block_dim, block_idx;
inline std::vector<char> smem_buf;
inline char* dyn_smem = nullptr;
inline std::function<void()> body;
inline int live = 0, bar_arrived = 0;
inline long bar_gen = 0;
inline std::vector<int> warp_arrived, warp_live;
inline std::vector<long> warp_gen;
inline std::vector<uint64_t> shfl;
inline cudaError_t last_error = cudaSuccess;
inline std::map<const void*, int> smem_optin;
inline long switches = 0;

inline void yield() {
  ++switches;
  if (!_setjmp(cur->jb)) _longjmp(sched_jb, 1);
}

inline void block_sync() {
  const long g = bar_gen;
  if (++bar_arrived == live) {
    bar_arrived = 0;
    ++bar_gen;
    return;
  }
  while (bar_gen == g) yield();
}

inline void warp_sync() {
  const unsigned w = cur->lin / 32;
  const long g = warp_gen[w];
  if (++warp_arrived[w] == warp_live[w]) {
    warp_arrived[w] = 0;
    ++warp_gen[w];
    return;
  }
  while (warp_gen[w] == g) yield();
}

inline void trampoline() {
  body();
  cur->done = true;
  --live;
  const unsigned w = cur->lin / 32;
  --warp_live[w];
  if (bar_arrived > 0 && bar_arrived == live) {
    bar_arrived = 0;
    ++bar_gen;
  }
  if (warp_arrived[w] > 0 && warp_arrived[w] == warp_live[w]) {
    warp_arrived[w] = 0;
    ++warp_gen[w];
  }
  _longjmp(sched_jb, 1);
}

inline void run_block(unsigned n) {
  if (fibers.size() < n) {
    const size_t old = fibers.size();
    fibers.resize(n);
    for (size_t i = old; i < n; ++i) fibers[i].stack = static_cast<char*>(std::malloc(k_stack));
  }
  live = int(n);
  bar_arrived = 0;
  const unsigned nw = (n + 31) / 32;
  warp_arrived.assign(nw, 0);
  warp_gen.assign(nw, 0);
  warp_live.assign(nw, 0);
  shfl.assign(nw * 32, 0);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.lin = i;
    f.tidx = dim3(i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y));
    f.started = f.done = false;
    ++warp_live[i / 32];
  }
  long rounds = 0;
  while (live > 0) {
    if (++rounds > 100000000) {
      std::fprintf(stderr, "emu: deadlock\n");
      std::abort();
    }
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers[i];
      if (f.done) continue;
      cur = &f;
      if (!_setjmp(sched_jb)) {
        if (!f.started) {
          f.started = true;
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack;
          f.uc.uc_stack.ss_size = k_stack;
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, trampoline, 0);
          setcontext(&f.uc);
        } else {
          _longjmp(f.jb, 1);
        }
      }
    }
  }
  cur = nullptr;
}

inline void launch(const void* fn, dim3 g, dim3 b, size_t smem, std::function<void()> f) {
  const unsigned n = b.x * b.y * b.z;
  auto it = smem_optin.find(fn);
  const size_t limit = it != smem_optin.end() ? size_t(it->second) : 48 * 1024;
  if (n == 0 || n > 1024 || g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || smem > limit) {
    std::fprintf(stderr, "emu: bad launch grid (%u,%u,%u) block %u smem %zu (limit %zu)\n", g.x, g.y, g.z, n, smem,
                 limit);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  grid_dim = g;
  block_dim = b;
  body = std::move(f);
  smem_buf.assign(smem + 256, char(0xff));
  dyn_smem = smem_buf.data() + (256 - reinterpret_cast<uintptr_t>(smem_buf.data()) % 256) % 256;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        block_idx = dim3(x, y, z);
        std::fill(smem_buf.begin(), smem_buf.end(), char(0xff));
        run_block(n);
      }
}

}  // namespace emu

#define threadIdx (::emu::cur->tidx)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)

inline void __syncthreads() { emu::block_sync(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_sync(); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8);
  const unsigned t = emu::cur->lin, w = t / 32, lane = t % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::shfl[t] = bits;
  emu::warp_sync();
  T r;
  bits = emu::shfl[w * 32 + (lane ^ unsigned(o))];
  std::memcpy(&r, &bits, sizeof(T));
  emu::warp_sync();
  return r;
}

template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d) {
  static_assert(sizeof(T) <= 8);
  const unsigned t = emu::cur->lin, w = t / 32, lane = t % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::shfl[t] = bits;
  emu::warp_sync();
  T r = v;
  if (lane >= d) {
    bits = emu::shfl[w * 32 + lane - d];
    std::memcpy(&r, &bits, sizeof(T));
  }
  emu::warp_sync();
  return r;
}
// Every live thread's predicate, or-ed (a block barrier, like __syncthreads).
inline int __syncthreads_or(int pred) {
  static int acc;
  emu::block_sync();
  if (emu::cur->lin == 0) acc = 0;
  emu::block_sync();
  if (pred) acc = 1;
  emu::block_sync();
  const int r = acc;
  emu::block_sync();
  return r;
}
using std::isnan;
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- runtime API ----
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmu"; }
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount ? 132 : 232448;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::snprintf(p->name, sizeof(p->name), "EMU");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = size_t(1) << 34;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(uintptr_t(0x10));
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) {
  if (posix_memalign(p, 256, n ? n : 1) != 0) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xab, n);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
#define cudaHostAllocDefault 0u
inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  std::memset(d, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  *f = *t = size_t(1) << 34;
  return cudaSuccess;
}
template <class F>
inline cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute, int v) {
  emu::smem_optin[reinterpret_cast<const void*>(fn)] = v;
  return cudaSuccess;
}

// ---- cuBLAS ----
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(uintptr_t(0x20));
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char* cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMU"; }
inline const char* cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS error"; }
namespace emu {
inline double elem(const void* p, cudaDataType_t t, size_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16F: return exl::half_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return exl::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}
inline cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                           const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                           const float* beta, void* C, cudaDataType_t ct, int ldc) {
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m) || ct != CUDA_R_32F) {
    std::fprintf(stderr, "emu: bad gemm m=%d n=%d k=%d lda=%d ldb=%d ldc=%d\n", m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float* c = static_cast<float*>(C);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const double a = elem(A, at, ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda : size_t(l) + size_t(i) * lda);
        const double b = elem(B, bt, tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb : size_t(j) + size_t(l) * ldb);
        s += a * b;
      }
      float& out = c[size_t(i) + size_t(j) * ldc];
      out = float(*alpha * s + (*beta != 0 ? *beta * out : 0.0));
    }
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace emu
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                                   cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t, cublasGemmAlgo_t) {
  return emu::gemm(ta, tb, m, n, k, static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
                   static_cast<const float*>(beta), C, ct, ldc);
}
inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B, int ldb,
                                  const float* beta, float* C, int ldc) {
  return emu::gemm(ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc);
}
