#include "kernels/cuda/cuda_prefill_attention.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/prefill_attention.h"

namespace exl::cuda {

namespace {

// Scores (fp32) plus probabilities (fp16) of one chunk: at most this many elements (1.5 GiB).
constexpr int64_t k_score_budget = int64_t(256) << 20;

}  // namespace

void prefill_attention(CudaContext& ctx, const uint8_t* pool, const KvDeviceLayout& L, const float* q, float* out,
                       int n_heads, float scale, int window, const PrefillAttnSeq& seq) {
  const int64_t D = L.head_dim, T = seq.n_tokens, n_keys = seq.pos_start + seq.n_tokens;
  const int group = n_heads / L.n_kv_heads;
  if (T == 0) return;
  auto* kv16 = static_cast<uint16_t*>(ctx.scratch(Scratch::attn_kv, size_t(2 * L.n_kv_heads * n_keys * D) * 2));
  uint16_t* k16 = kv16;
  uint16_t* v16 = kv16 + L.n_kv_heads * n_keys * D;
  EXL_CUDA_CHECK(gather_kv(pool, L, seq.pages, int(n_keys), k16, v16, ctx.stream()));
  auto* q16 = static_cast<uint16_t*>(ctx.scratch(Scratch::act16, size_t(T * n_heads * D) * 2));
  EXL_CUDA_CHECK(to_half(q + seq.token_begin * n_heads * D, q16, T * n_heads * D, ctx.stream()));

  const int64_t chunk = std::clamp<int64_t>(k_score_budget / (int64_t(n_heads) * n_keys), 16, T);
  auto* sbuf = static_cast<char*>(ctx.scratch(Scratch::attn_scores, size_t(n_heads * chunk * n_keys) * 6));
  float* s = reinterpret_cast<float*>(sbuf);
  auto* p = reinterpret_cast<uint16_t*>(sbuf + size_t(n_heads * chunk * n_keys) * 4);
  const float zero = 0.0f, one = 1.0f;
  const size_t nh = static_cast<size_t>(n_heads);
  std::vector<const void*> a(nh), b(nh);
  std::vector<void*> c(nh);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t rows = std::min(chunk, T - t0), keys = seq.pos_start + t0 + rows;
    for (int h = 0; h < n_heads; ++h) {
      a[size_t(h)] = k16 + (h / group) * n_keys * D;
      b[size_t(h)] = q16 + (t0 * n_heads + h) * D;
      c[size_t(h)] = s + h * rows * keys;
    }
    const auto* da = ctx.stage(a);
    const auto* db = ctx.stage(b);
    const auto* dc = ctx.stage(c);
    EXL_CUBLAS_CHECK(cublasGemmBatchedEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, int(keys), int(rows), int(D), &scale,
                                         da, CUDA_R_16F, int(D), db, CUDA_R_16F, int(n_heads * D), &zero, dc,
                                         CUDA_R_32F, int(keys), n_heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    EXL_CUDA_CHECK(causal_softmax(s, p, n_heads, int(rows), int(keys), int(seq.pos_start + t0), window, ctx.stream()));
    for (int h = 0; h < n_heads; ++h) {
      a[size_t(h)] = v16 + (h / group) * n_keys * D;
      b[size_t(h)] = p + h * rows * keys;
      c[size_t(h)] = out + ((seq.token_begin + t0) * n_heads + h) * D;
    }
    const auto* da2 = ctx.stage(a);
    const auto* db2 = ctx.stage(b);
    const auto* dc2 = ctx.stage(c);
    EXL_CUBLAS_CHECK(cublasGemmBatchedEx(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, int(D), int(rows), int(keys), &one,
                                         da2, CUDA_R_16F, int(D), db2, CUDA_R_16F, int(keys), &zero, dc2, CUDA_R_32F,
                                         int(n_heads * D), n_heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace exl::cuda
