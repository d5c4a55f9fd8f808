#include "kernels/cuda/cuda_prefill_attention.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/prefill_attention.h"

namespace exl::cuda {

namespace {

// Scores (fp32) plus probabilities (fp16, or an fp16 pair when exact) of one chunk: at most this
// many bytes.
constexpr int64_t k_score_bytes = int64_t(3) << 29;  // 1.5 GiB

}  // namespace

void prefill_attention(CudaContext& ctx, const uint8_t* pool, const KvDeviceLayout& L, const float* q, float* out,
                       int n_heads, float scale, int window, const PrefillAttnSeq& seq, bool exact) {
  const int64_t D = L.head_dim, T = seq.n_tokens, n_keys = seq.pos_start + seq.n_tokens;
  const int group = n_heads / L.n_kv_heads;
  if (T == 0) return;
  const int64_t kv_elems = L.n_kv_heads * n_keys * D;
  auto* kv16 = static_cast<uint16_t*>(ctx.scratch(Scratch::attn_kv, size_t((exact ? 4 : 2) * kv_elems) * 2));
  uint16_t* k16 = kv16;
  uint16_t* v16 = kv16 + kv_elems;
  uint16_t* k16_lo = exact ? kv16 + 2 * kv_elems : nullptr;
  uint16_t* v16_lo = exact ? kv16 + 3 * kv_elems : nullptr;
  EXL_CUDA_CHECK(gather_kv(pool, L, seq.pages, int(n_keys), k16, v16, k16_lo, v16_lo, ctx.stream()));
  const int64_t q_elems = T * n_heads * D;
  const float* qs = q + seq.token_begin * n_heads * D;
  auto* q16 = static_cast<uint16_t*>(ctx.scratch(Scratch::act16, size_t(q_elems) * 2));
  uint16_t* q16_lo = exact ? static_cast<uint16_t*>(ctx.scratch(Scratch::act16_lo, size_t(q_elems) * 2)) : nullptr;
  if (exact) EXL_CUDA_CHECK(split_half(qs, q16, q16_lo, q_elems, ctx.stream()));
  else EXL_CUDA_CHECK(to_half(qs, q16, q_elems, ctx.stream()));

  const int64_t per = exact ? 8 : 6;  // bytes per score: fp32 s, then p (and p_lo) in fp16
  const int64_t chunk = std::clamp<int64_t>(k_score_bytes / (per * n_heads * n_keys), 16, T);
  auto* sbuf = static_cast<char*>(ctx.scratch(Scratch::attn_scores, size_t(n_heads * chunk * n_keys * per)));
  float* s = reinterpret_cast<float*>(sbuf);
  auto* p = reinterpret_cast<uint16_t*>(sbuf + size_t(n_heads * chunk * n_keys) * 4);
  uint16_t* p_lo = exact ? p + n_heads * chunk * n_keys : nullptr;
  const float zero = 0.0f, one = 1.0f, lo_scale = 1.0f / k_split_lo_scale, scale_lo = scale / k_split_lo_scale;
  const size_t nh = static_cast<size_t>(n_heads);
  std::vector<const void*> a(nh), b(nh);
  std::vector<void*> c(nh);
  // One batched product over the heads: C_h = alpha·op(A_h)·B_h + beta·C_h.
  const auto batched = [&](cublasOperation_t op_a, int m, int n, int k, const float* alpha, const uint16_t* a_base,
                           int64_t a_head, int lda, const uint16_t* b_base, int64_t b_head, int ldb, const float* beta,
                           float* c_base, int64_t c_head, int ldc) {
    for (int h = 0; h < n_heads; ++h) {
      a[size_t(h)] = a_base + (h / group) * a_head;
      b[size_t(h)] = b_base + h * b_head;
      c[size_t(h)] = c_base + h * c_head;
    }
    const auto* da = ctx.stage(a);
    const auto* db = ctx.stage(b);
    const auto* dc = ctx.stage(c);
    EXL_CUBLAS_CHECK(cublasGemmBatchedEx(ctx.cublas(), op_a, CUBLAS_OP_N, m, n, k, alpha, da, CUDA_R_16F, lda, db,
                                         CUDA_R_16F, ldb, beta, dc, CUDA_R_32F, ldc, n_heads, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
  };
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t rows = std::min(chunk, T - t0), keys = seq.pos_start + t0 + rows;
    const int64_t q_off = t0 * n_heads * D;
    const auto scores = [&](const uint16_t* kk, const uint16_t* qq, const float* alpha, const float* beta) {
      batched(CUBLAS_OP_T, int(keys), int(rows), int(D), alpha, kk, n_keys * D, int(D), qq + q_off, D,
              int(n_heads * D), beta, s, rows * keys, int(keys));
    };
    scores(k16, q16, &scale, &zero);
    if (exact) {
      scores(k16, q16_lo, &scale_lo, &one);
      scores(k16_lo, q16, &scale_lo, &one);
    }
    EXL_CUDA_CHECK(
        causal_softmax(s, p, p_lo, n_heads, int(rows), int(keys), int(seq.pos_start + t0), window, ctx.stream()));
    float* o = out + (seq.token_begin + t0) * n_heads * D;
    const auto values = [&](const uint16_t* vv, const uint16_t* pp, const float* alpha, const float* beta) {
      batched(CUBLAS_OP_N, int(D), int(rows), int(keys), alpha, vv, n_keys * D, int(D), pp, rows * keys, int(keys),
              beta, o, D, int(n_heads * D));
    };
    values(v16, p, &one, &zero);
    if (exact) {
      values(v16, p_lo, &lo_scale, &one);
      values(v16_lo, p, &lo_scale, &one);
    }
  }
}

}  // namespace exl::cuda
