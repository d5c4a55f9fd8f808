// CPU emulation of the CUDA subset used by kernels/cuda/ (see ../Makefile), for checking kernel
// logic without a GPU. Blocks run one at a time; the threads of a block are cooperative fibers
// (ucontext + _setjmp); __syncthreads, __syncwarp, shuffles, votes and mma.sync are barriers among
// the live threads of the block or warp. fp16 arithmetic rounds once, to nearest even, as the
// hardware's. Inline PTX arrives as calls of emu::asm_<opcode> (gen.py): lop3.b32, prefetch
// (a no-op), atom.add.u32, ldmatrix.x4 (.trans), movmatrix (.trans) and mma.sync m16n8k16 f16→f32, the last with the fragment layouts of the
// PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type") and exact products summed
// in double. Device memory is host memory; streams are one in-order queue run at once, stream
// capture records launches and async copies for graph replay; events are no-ops; cuBLAS GEMMs are
// naive loops that validate their arguments. Not emulated: thread block clusters (the device
// reports compute capability 8.0 so that the backend does not use them), concurrency between blocks.
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
#include <strings.h>
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
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
  unsigned x, y, z, w;
};
struct int4 {
  int x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct float4 {
  float x, y, z, w;
};
struct float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorNoDevice = 100
} cudaError_t;
typedef struct CUstream_st* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
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
struct __half2 {
  __half x, y;
};
namespace emu {
[[noreturn]] inline void unsupported(const char* what) {
  std::fprintf(stderr, "emu: %s is not emulated\n", what);
  std::abort();
}
// Dynamic shared memory accessed through its shared-window offsets (cp.async, ldmatrix) past the
// launch's size: the kernel's own bug, caught rather than read from the next allocation.
inline size_t dyn_smem_bytes = 0;
inline void check_smem(unsigned offset, unsigned n, const char* what) {
  if (size_t(offset) + n > dyn_smem_bytes) {
    std::fprintf(stderr, "emu: %s at shared offset %u (+%u) past the launch's %zu bytes\n", what, offset, n,
                 dyn_smem_bytes);
    std::abort();
  }
}
// v rounded once to the nearest fp16 (ties to even), subnormals and overflow to infinity included.
inline unsigned short to_half(double v) {
  if (std::isnan(v)) return 0x7e00;
  const unsigned short sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a >= 65520.0) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);
  int ex = std::max(e - 1, -14);               // a < 2^(ex+1); the quantum is 2^(ex-10)
  double r = std::nearbyint(std::ldexp(a, 10 - ex));  // default rounding: to nearest even
  if (r >= 2048.0) r /= 2, ++ex;               // rounded up into the next binade (exact)
  if (r < 1024.0) return sign | (unsigned short)r;  // subnormal (ex == -14) or zero
  if (ex > 15) return sign | 0x7c00;
  return sign | (unsigned short)((ex + 15) << 10 | (int(r) - 1024));
}
inline double from_half(__half h) { return exl::half_to_float(h.x); }
}  // namespace emu
inline float __half2float(__half h) { return exl::half_to_float(h.x); }
inline __half __float2half_rn(float f) { return {emu::to_half(f)}; }
inline __half2 __float2half2_rn(float f) { return {__float2half_rn(f), __float2half_rn(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __hadd2(__half2 a, __half2 b) {
  using emu::from_half;
  return {{emu::to_half(from_half(a.x) + from_half(b.x))}, {emu::to_half(from_half(a.y) + from_half(b.y))}};
}
inline __half2 __hmul2(__half2 a, __half2 b) {
  using emu::from_half;
  return {{emu::to_half(from_half(a.x) * from_half(b.x))}, {emu::to_half(from_half(a.y) * from_half(b.y))}};
}
// Products of fp16 values are exact in double, and the sum rounds once there: one rounding to fp16.
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  using emu::from_half;
  return {{emu::to_half(from_half(a.x) * from_half(b.x) + from_half(c.x))},
          {emu::to_half(from_half(a.y) * from_half(b.y) + from_half(c.y))}};
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return unsigned(((uint64_t(hi) << 32) | lo) >> (shift & 31));
}
inline int __ffs(int x) { return ::ffs(x); }
inline float __expf(float x) { return std::exp(x); }
[[noreturn]] inline void __trap() { emu::unsupported("__trap (a kernel trapped)"); }
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
template <class T>
inline T __ldcg(const T* p) {
  return __ldg(p);
}
template <class T>
inline T atomicAdd(T* p, T v) {
  const T o = *p;
  *p = o + v;
  return o;
}
template <class T>
inline T atomicMax(T* p, T v) {
  const T o = *p;
  if (v > o) *p = v;
  return o;
}
template <class T>
inline T atomicOr(T* p, T v) {
  const T o = *p;
  *p = o | v;
  return o;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace emu {

// A cp.async copy in flight: the bytes read at issue, written to shared memory when its group is
// waited for (so a read before cp.async.wait_group sees the old, poisoned bytes, as on a GPU).
struct AsyncCopy {
  unsigned smem;
  std::vector<char> bytes;
};

struct Fiber {
  ucontext_t uc;
  jmp_buf jb;
  char* stack = nullptr;
  dim3 tidx;
  unsigned lin = 0;
  bool started = false, done = false;
  std::vector<AsyncCopy> cp_open;
  std::vector<std::vector<AsyncCopy>> cp_groups;
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
    f.cp_open.clear();
    f.cp_groups.clear();
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

// Stream capture: launches and async copies recorded for replay instead of run (relaxed mode).
inline bool capturing = false, capture_failed = false;
inline std::vector<std::function<void()>> captured;
inline bool enqueue(std::function<void()> op) {
  if (!capturing) return false;
  captured.push_back(std::move(op));
  return true;
}

template <class F>
inline const void* fn_key(F* f) {
  return reinterpret_cast<const void*>(f);
}

inline void run_grid(dim3 g, dim3 b, size_t smem, const std::function<void()>& f) {
  const unsigned n = b.x * b.y * b.z;
  grid_dim = g;
  block_dim = b;
  body = f;
  smem_buf.assign(smem + 256, char(0xff));
  dyn_smem_bytes = smem;
  dyn_smem = smem_buf.data() + (256 - reinterpret_cast<uintptr_t>(smem_buf.data()) % 256) % 256;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        block_idx = dim3(x, y, z);
        std::fill(smem_buf.begin(), smem_buf.end(), char(0xff));
        run_block(n);
      }
}

// EMU_LOG_LAUNCHES=1 prints every launch (kernel, grid, block, shared memory) to stderr.
inline const bool log_launches = [] {
  const char* e = std::getenv("EMU_LOG_LAUNCHES");
  return e && e[0] == '1';
}();

// `fn` keys the dynamic shared memory opt-in (cudaFuncSetAttribute); null for kernels without one.
inline void launch(const void* fn, const char* name, dim3 g, dim3 b, size_t smem, std::function<void()> f) {
  const unsigned n = b.x * b.y * b.z;
  if (log_launches)
    std::fprintf(stderr, "emu: %s%s grid (%u,%u,%u) block %u smem %zu\n", capturing ? "(captured) " : "", name, g.x,
                 g.y, g.z, n, smem);
  auto it = smem_optin.find(fn);
  const size_t limit = it != smem_optin.end() ? size_t(it->second) : 48 * 1024;
  if (n == 0 || n > 1024 || g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || smem > limit) {
    std::fprintf(stderr, "emu: bad launch grid (%u,%u,%u) block %u smem %zu (limit %zu)\n", g.x, g.y, g.z, n, smem,
                 limit);
    last_error = cudaErrorInvalidConfiguration;
    if (capturing) capture_failed = true;
    return;
  }
  if (!enqueue([=] { run_grid(g, b, smem, f); })) run_grid(g, b, smem, f);
}

}  // namespace emu

#define threadIdx (::emu::cur->tidx)
inline size_t __cvta_generic_to_shared(const void* p) { return size_t(static_cast<const char*>(p) - ::emu::dyn_smem); }
inline const dim3& blockIdx = ::emu::block_idx;
inline const dim3& blockDim = ::emu::block_dim;
inline const dim3& gridDim = ::emu::grid_dim;

inline void __syncthreads() { emu::block_sync(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_sync(); }
namespace emu {
// Lane l of the warp gets the v of lane src(l), or keeps its own where src(l) < 0.
template <class T, class Src>
inline T warp_exchange(T v, Src src) {
  static_assert(sizeof(T) <= 8);
  const unsigned t = cur->lin, w = t / 32, lane = t % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  shfl[t] = bits;
  warp_sync();
  T r = v;
  if (const int from = src(lane); from >= 0) {
    bits = shfl[w * 32 + unsigned(from)];
    std::memcpy(&r, &bits, sizeof(T));
  }
  warp_sync();
  return r;
}
}  // namespace emu
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  return emu::warp_exchange(v, [o](unsigned lane) { return int(lane ^ unsigned(o)); });
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d) {
  return emu::warp_exchange(v, [d](unsigned lane) { return lane >= d ? int(lane - d) : -1; });
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
inline unsigned __ballot_sync(unsigned, int pred) {
  static std::vector<unsigned> acc;
  const unsigned w = emu::cur->lin / 32;
  if (acc.size() < emu::warp_live.size()) acc.resize(emu::warp_live.size());
  emu::warp_sync();
  acc[w] = 0;
  emu::warp_sync();
  if (pred) acc[w] |= 1u << (emu::cur->lin % 32);
  emu::warp_sync();
  const unsigned r = acc[w];
  emu::warp_sync();
  return r;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0u; }
using std::isnan;

// ---- inline PTX (gen.py turns each asm statement into one of these) ----
namespace emu {
// lop3.b32 d, a, b, c, immLut: bit i of d is bit (a_i·4 + b_i·2 + c_i) of immLut (the table of
// F(0xF0, 0xCC, 0xAA)).
inline void asm_lop3_b32(uint32_t& d, uint32_t a, uint32_t b, uint32_t c, uint32_t lut) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    const unsigned idx = ((a >> i) & 1u) << 2 | ((b >> i) & 1u) << 1 | ((c >> i) & 1u);
    r |= ((lut >> idx) & 1u) << i;
  }
  d = r;
}
inline void asm_prefetch_global_L2(const void*) {}
inline void asm_fence_proxy_async_shared__cta() {}
// cp.async to dynamic shared memory only: __cvta_generic_to_shared gives the offset into it.
inline void asm_cp_async_cg_shared_global(unsigned smem, const void* g, unsigned n) {
  check_smem(smem, n, "cp.async");
  const char* src = static_cast<const char*>(g);
  cur->cp_open.push_back({smem, std::vector<char>(src, src + n)});
}
inline void asm_cp_async_ca_shared_global(unsigned smem, const void* g, unsigned n) {
  asm_cp_async_cg_shared_global(smem, g, n);
}
inline void asm_cp_async_commit_group() {
  cur->cp_groups.push_back(std::move(cur->cp_open));
  cur->cp_open.clear();
}
inline void asm_cp_async_wait_group(unsigned n) {
  while (cur->cp_groups.size() > n) {
    for (const AsyncCopy& c : cur->cp_groups.front()) std::memcpy(dyn_smem + c.smem, c.bytes.data(), c.bytes.size());
    cur->cp_groups.erase(cur->cp_groups.begin());
  }
}
inline void asm_atom_acq_rel_gpu_global_add_u32(unsigned& d, unsigned* p, unsigned v) {
  d = *p;
  *p += v;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0..r3}, [addr] (shared addresses are
// offsets into the dynamic shared memory): lane l gives the address of row l % 8 (16 bytes) of
// matrix l / 8; lane l receives in r_i, low half first, matrix i's row l / 4 at columns
// 2(l % 4), 2(l % 4) + 1, or with .trans its rows 2(l % 4), 2(l % 4) + 1 at column l / 4.
inline std::vector<unsigned> ldmatrix_addr;
inline void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, unsigned addr, bool trans) {
  const unsigned t = cur->lin, w = t / 32, lane = t % 32;
  if (warp_live[w] != 32) unsupported("ldmatrix with fewer than 32 live threads in the warp");
  if (ldmatrix_addr.size() < warp_live.size() * 32) ldmatrix_addr.resize(warp_live.size() * 32);
  check_smem(addr, 16, "ldmatrix");
  ldmatrix_addr[t] = addr;
  warp_sync();
  const unsigned g = lane / 4, tg = lane % 4;
  const auto elem = [&](unsigned m, unsigned row, unsigned col) {
    uint16_t v;
    std::memcpy(&v, dyn_smem + ldmatrix_addr[w * 32 + 8 * m + row] + 2 * col, 2);
    return uint32_t(v);
  };
  uint32_t r[4];
  for (unsigned m = 0; m < 4; ++m)
    r[m] = trans ? elem(m, 2 * tg, g) | elem(m, 2 * tg + 1, g) << 16 : elem(m, g, 2 * tg) | elem(m, g, 2 * tg + 1) << 16;
  warp_sync();  // every lane has read before any deposits again
  r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void asm_ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                         unsigned addr) {
  ldmatrix_x4(r0, r1, r2, r3, addr, false);
}
inline void asm_ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                               uint32_t& r3, unsigned addr) {
  ldmatrix_x4(r0, r1, r2, r3, addr, true);
}

// movmatrix.sync.aligned.m8n8.trans.b16 d, a: lane l holds row l / 4, columns 2(l % 4) and + 1 of
// the warp's 8×8 matrix (low half first) and receives the same of its transpose.
inline std::vector<uint32_t> movmatrix_in;
inline void asm_movmatrix_sync_aligned_m8n8_trans_b16(uint32_t& d, uint32_t a) {
  const unsigned t = cur->lin, w = t / 32, lane = t % 32;
  if (warp_live[w] != 32) unsupported("movmatrix with fewer than 32 live threads in the warp");
  if (movmatrix_in.size() < warp_live.size() * 32) movmatrix_in.resize(warp_live.size() * 32);
  movmatrix_in[t] = a;
  warp_sync();
  const auto elem = [&](unsigned row, unsigned col) {  // of the source matrix
    return (movmatrix_in[w * 32 + row * 4 + col / 2] >> (16 * (col % 2))) & 0xffffu;
  };
  const unsigned g = lane / 4, tg = lane % 4;
  const uint32_t r = elem(2 * tg, g) | elem(2 * tg + 1, g) << 16;
  warp_sync();  // every lane has read before any deposits again
  d = r;
}

struct MmaIn {
  uint32_t a[4], b[2];
};
inline std::vector<MmaIn> mma_in;
inline double half_lo(uint32_t r) { return exl::half_to_float(uint16_t(r & 0xffffu)); }
inline double half_hi(uint32_t r) { return exl::half_to_float(uint16_t(r >> 16)); }
// Element i of a lane's fragment: register i / 2, the low half first.
inline double frag_elem(const uint32_t* regs, int i) { return i % 2 ? half_hi(regs[i / 2]) : half_lo(regs[i / 2]); }

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3}: the
// warp's D = A·B + C. Layouts (PTX ISA, m16n8k16 floating point; groupID = lane >> 2,
// threadID_in_group = lane % 4, elements a0..a7 / b0..b3 low half first in the registers):
//   A (16×16, a_i): row groupID for i ∈ {0,1,4,5}, else groupID + 8;
//                   col threadID_in_group·2 + (i & 1), + 8 for i ≥ 4.
//   B (16×8, b_i):  row threadID_in_group·2 + (i & 1), + 8 for i ≥ 2; col groupID.
//   C/D (16×8, c_i): row groupID for i < 2, else groupID + 8; col threadID_in_group·2 + (i & 1).
inline void asm_mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(float& d0, float& d1, float& d2, float& d3,
                                                                   uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                                   uint32_t b0, uint32_t b1, float c0, float c1,
                                                                   float c2, float c3) {
  const unsigned t = cur->lin, w = t / 32, lane = t % 32;
  if (warp_live[w] != 32) unsupported("mma.sync with fewer than 32 live threads in the warp");
  if (mma_in.size() < warp_live.size() * 32) mma_in.resize(warp_live.size() * 32);
  mma_in[t] = {{a0, a1, a2, a3}, {b0, b1}};
  warp_sync();
  double A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const MmaIn& in = mma_in[w * 32 + l];
    const int g = int(l >> 2), tg = int(l % 4);
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = tg * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = frag_elem(in.a, i);
    }
    for (int i = 0; i < 4; ++i) {
      const int row = tg * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][g] = frag_elem(in.b, i);
    }
  }
  warp_sync();  // every lane has read the fragments before any deposits again
  const float c[4] = {c0, c1, c2, c3};
  float d[4];
  const int g = int(lane >> 2), tg = int(lane % 4);
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? g : g + 8, col = tg * 2 + (i & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[i] = float(s + double(c[i]));
  }
  d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
}
}  // namespace emu
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
  *v = a == cudaDevAttrMultiProcessorCount        ? 132
       : a == cudaDevAttrComputeCapabilityMajor ? 8
       : a == cudaDevAttrComputeCapabilityMinor ? 0
       : a == cudaDevAttrMaxSharedMemoryPerMultiprocessor ? 233472
                                                : 232448;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::snprintf(p->name, sizeof(p->name), "EMU");
  p->major = 8;
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
  if (!emu::enqueue([=] { std::memmove(d, s, n); })) std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy2DAsync(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height,
                                     cudaMemcpyKind, cudaStream_t) {
  auto copy = [=] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(d) + r * dpitch, static_cast<const char*>(s) + r * spitch, width);
  };
  if (!emu::enqueue(copy)) copy();
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  if (!emu::enqueue([=] { std::memset(d, v, n); })) std::memset(d, v, n);
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

// Events: the emulated stream has finished its work whenever the host looks.
typedef struct CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 2u
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(uintptr_t(0x30));
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}

// Graphs: what a capture recorded, replayed in order (copies read their sources at replay).
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (emu::capturing) return cudaErrorInvalidValue;
  emu::capturing = true;
  emu::capture_failed = false;
  emu::captured.clear();
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  *g = nullptr;
  if (!emu::capturing) return cudaErrorInvalidValue;
  emu::capturing = false;
  if (emu::capture_failed) return cudaErrorStreamCaptureInvalidated;
  *g = new CUgraph_st{std::move(emu::captured)};
  emu::captured.clear();
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long = 0) {
  *e = new CUgraphExec_st{g->ops};
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
  if (emu::capturing) return cudaErrorNotSupported;
  for (const auto& op : e->ops) op();
  return cudaSuccess;
}

// Extensible launches exist for thread block clusters and programmatic dependent launch (sm_90),
// which are not emulated: the emulated device is sm_80, so the backend launches as usual.
enum cudaLaunchAttributeID {
  cudaLaunchAttributeProgrammaticStreamSerialization = 3,
  cudaLaunchAttributeClusterDimension = 4
};
struct cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};
template <class... P, class... A>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t*, void (*)(P...), A&&...) {
  emu::unsupported("cudaLaunchKernelEx (thread block clusters, programmatic dependent launch)");
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
inline cublasStatus_t cublasGemmBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* const A[], cudaDataType_t at, int lda,
                                          const void* const B[], cudaDataType_t bt, int ldb, const void* beta,
                                          void* const C[], cudaDataType_t ct, int ldc, int batch, cublasComputeType_t,
                                          cublasGemmAlgo_t) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batch; ++i) {
    const cublasStatus_t s = emu::gemm(ta, tb, m, n, k, static_cast<const float*>(alpha), A[i], at, lda, B[i], bt, ldb,
                                       static_cast<const float*>(beta), C[i], ct, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
typedef enum { CUBLAS_FILL_MODE_LOWER = 0, CUBLAS_FILL_MODE_UPPER = 1 } cublasFillMode_t;
typedef enum { CUBLAS_SIDE_LEFT = 0, CUBLAS_SIDE_RIGHT = 1 } cublasSideMode_t;
typedef enum { CUBLAS_DIAG_NON_UNIT = 0, CUBLAS_DIAG_UNIT = 1 } cublasDiagType_t;
// C [n, n] = alpha·A·Aᵀ + beta·C (trans N, A [n, k]) in the `uplo` triangle only, double sums.
inline cublasStatus_t cublasSsyrk(cublasHandle_t, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* beta, float* C, int ldc) {
  if (trans != CUBLAS_OP_N) emu::unsupported("cublasSsyrk with a transposed A");
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) {
      if (uplo == CUBLAS_FILL_MODE_LOWER ? i < j : i > j) continue;
      double s = 0;
      for (int l = 0; l < k; ++l) s += double(A[i + size_t(l) * lda]) * double(A[j + size_t(l) * lda]);
      float& out = C[i + size_t(j) * ldc];
      out = float(*alpha * s + (*beta != 0 ? *beta * out : 0.0));
    }
  return CUBLAS_STATUS_SUCCESS;
}
// C [n, n] = alpha·A·Aᵀ + beta·C (A [n, k], no transpose) in the lower triangle only.
inline cublasStatus_t cublasDsyrk(cublasHandle_t, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,
                                  const double* alpha, const double* A, int lda, const double* beta, double* C,
                                  int ldc) {
  if (uplo != CUBLAS_FILL_MODE_LOWER || trans != CUBLAS_OP_N) emu::unsupported("cublasDsyrk other than lower, N");
  for (int j = 0; j < n; ++j)
    for (int i = j; i < n; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) s += A[i + size_t(l) * lda] * A[j + size_t(l) * lda];
      double& out = C[i + size_t(j) * ldc];
      out = *alpha * s + (*beta != 0 ? *beta * out : 0.0);
    }
  return CUBLAS_STATUS_SUCCESS;
}
// Lower-triangular A, non-unit diagonal: left side B [m, n] := alpha·A⁻¹·B (no transpose), or
// right side B := alpha·B·A⁻ᵀ (transpose).
inline cublasStatus_t cublasDtrsm(cublasHandle_t, cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans,
                                  cublasDiagType_t diag, int m, int n, const double* alpha, const double* A, int lda,
                                  double* B, int ldb) {
  if (uplo != CUBLAS_FILL_MODE_LOWER || diag != CUBLAS_DIAG_NON_UNIT)
    emu::unsupported("cublasDtrsm other than lower, non-unit");
  if (side == CUBLAS_SIDE_LEFT && trans == CUBLAS_OP_N) {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = *alpha * B[i + size_t(j) * ldb];
        for (int l = 0; l < i; ++l) s -= A[i + size_t(l) * lda] * B[l + size_t(j) * ldb];
        B[i + size_t(j) * ldb] = s / A[i + size_t(i) * lda];
      }
  } else if (side == CUBLAS_SIDE_RIGHT && trans == CUBLAS_OP_T) {
    // X·Aᵀ = alpha·B: column j of X from columns l < j (Aᵀ is upper: X[:, j]·A[j, j] = alpha·B[:, j] − Σ X[:, l]·A[j, l]).
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = *alpha * B[i + size_t(j) * ldb];
        for (int l = 0; l < j; ++l) s -= B[i + size_t(l) * ldb] * A[j + size_t(l) * lda];
        B[i + size_t(j) * ldb] = s / A[j + size_t(j) * lda];
      }
  } else {
    emu::unsupported("cublasDtrsm other than (left, N) or (right, T)");
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B, int ldb,
                                  const float* beta, float* C, int ldc) {
  return emu::gemm(ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc);
}
