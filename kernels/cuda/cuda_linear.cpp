#include "kernels/cuda/cuda_linear.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/gptq_gemm.h"
#include "kernels/cuda/norm_rope_act.h"
#include "kernels/env_switch.h"
#include "kernels/int_math.h"

namespace exl::cuda {

namespace {

constexpr int64_t k_int_max = std::numeric_limits<int32_t>::max();

void check_dims(const char* fmt, int64_t K, int64_t N) {
  EXL_CHECK(K > 0 && N > 0 && K < k_int_max && N < k_int_max, "kernels: cuda: ", fmt, " linear: shape [", N, ", ",
            K, "] is empty or exceeds int32");
}

Buffer upload_bias(const CudaContext& ctx, const std::vector<float>& bias) {
  return bias.empty() ? Buffer() : ctx.upload_new(bias);
}

// y[rows, N] (ldy = N) = x · W(columns chunk)ᵀ where `fill` writes W's columns [n0, n0+nc) as fp16
// [K, nc] into the scratch; bias added at the end.
template <typename Fill>
void dequant_gemm(CudaContext& ctx, const float* x, float* y, int64_t rows, int64_t K, int64_t N, const float* bias,
                  Fill fill) {
  auto* x16 = static_cast<uint16_t*>(ctx.scratch(Scratch::act16, size_t(rows * K) * 2));
  EXL_CUDA_CHECK(to_half(x, x16, rows * K, ctx.stream()));
  const int64_t nc_max = std::max<int64_t>(128, ctx.dequant_chunk_elems / K / 128 * 128);
  const int64_t nc = std::min(nc_max, N);
  auto* wt = static_cast<uint16_t*>(ctx.scratch(Scratch::weights16, size_t(K * nc) * 2));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t n0 = 0; n0 < N; n0 += nc) {
    const int64_t cur = std::min(nc, N - n0);
    fill(int(n0), int(cur), wt);
    EXL_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, int(cur), int(rows), int(K), &one, wt,
                                  CUDA_R_16F, int(cur), x16, CUDA_R_16F, int(K), &zero, y + n0, CUDA_R_32F, int(N),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (bias) EXL_CUDA_CHECK(add_bias(y, bias, int(rows), int(N), ctx.stream()));
}

int exl2_target_blocks(const CudaContext& ctx, int64_t rows) { return gemv_blocks_per_sm(rows) * ctx.sm_count(); }

class Exl2Linear;

// One shared copy per distinct permutation among the live matrices.
std::shared_ptr<const std::vector<int32_t>> intern_perm(std::vector<int32_t> perm) {
  static std::mutex mu;
  static std::multimap<uint64_t, std::weak_ptr<const std::vector<int32_t>>> known;
  uint64_t h = 1469598103934665603ull;
  for (int32_t v : perm) h = (h ^ uint32_t(v)) * 1099511628211ull;
  const std::lock_guard<std::mutex> lock(mu);
  auto [lo, hi] = known.equal_range(h);
  for (auto it = lo; it != hi;) {
    auto p = it->second.lock();
    if (!p) {
      it = known.erase(it);
      continue;
    }
    if (*p == perm) return p;
    ++it;
  }
  auto p = std::make_shared<const std::vector<int32_t>>(std::move(perm));
  known.emplace(h, p);
  return p;
}
// What one exl2_gemv_set launch reads besides the weights (Exl2GemvSet's fields of the same names).
struct GemvInput {
  const float* x = nullptr;
  const float* x_up = nullptr;
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  bool residual = false;
  const Exl2RopeKv* rope = nullptr;
  const Exl2GemvHandoff* io = nullptr;
  bool exact = true;
};
// ys[j] = input · W_jᵀ for EXL2 matrices of one K (1..k_exl2_gemv_max_jobs) in one gemv launch.
void gemv_set(CudaContext& ctx, std::span<const Exl2Linear* const> set, std::span<float* const> ys, int64_t rows,
              const GemvInput& in);

class Exl2Linear final : public CudaLinear {
 public:
  Exl2Linear(CudaContext& ctx, const Exl2Matrix& m) {
    const int64_t K = m.in_features, N = m.out_features, Np = m.padded_out, G = int64_t(m.groups.size());
    check_dims("exl2", K, N);
    EXL_CHECK(Np >= N && Np % 32 == 0 && G > 0 && m.q_rows > 0 && int64_t(m.perm.size()) == K,
              "kernels: cuda: exl2 linear: inconsistent matrix [", N, ", ", K, "]");
    in_features = K;
    out_features = N;
    std::vector<Exl2GroupDesc> groups;
    std::vector<int32_t> group_of_row(static_cast<size_t>(K), -1);
    for (int64_t g = 0; g < G; ++g) {
      const Exl2Group& gr = m.groups[size_t(g)];
      EXL_CHECK(gr.row_start >= 0 && gr.rows > 0 && gr.row_start + gr.rows <= K,
                "kernels: cuda: exl2 linear: group ", g, " rows out of range");
      EXL_CHECK(gr.bits >= 2 && gr.bits <= 8 && gr.bits != 7, "kernels: cuda: exl2 linear: group ", g, " has ",
                gr.bits, " bits");
      groups.push_back({gr.bits, int32_t(gr.row_start), int32_t(gr.rows), int32_t(gr.qrow_start)});
      std::fill(group_of_row.begin() + gr.row_start, group_of_row.begin() + gr.row_start + gr.rows, int32_t(g));
    }
    EXL_CHECK(std::find(group_of_row.begin(), group_of_row.end(), -1) == group_of_row.end(),
              "kernels: cuda: exl2 linear: groups do not cover all ", K, " rows");
    Exl2Segment segs[k_exl2_max_segments];
    const int n_segs = exl2_segments(groups.data(), int(G), int(K), segs);
    if (n_segs > 0) {
      segs_ = ctx.upload_new(segs, size_t(n_segs) * sizeof(Exl2Segment));
      std::vector<Exl2Block> blocks(size_t(K / 32));
      exl2_blocks(groups.data(), int(G), blocks.data());
      blocks_ = ctx.upload_new(blocks);
    }
    q_weight_ = ctx.upload_new(m.q_weight, size_t(m.q_rows * Np) * 4);
    q_scale_ = ctx.upload_new(m.q_scale, size_t(G * (Np / 8)) * 4);
    std::vector<uint16_t> scale_max(m.q_scale_max, m.q_scale_max + G);
    scale_max.resize(size_t(G + (G & 1)), 0);  // whole aligned pairs for exl2_mma_set
    q_scale_max_ = ctx.upload_new(scale_max);
    groups_ = ctx.upload_new(groups);
    group_of_row_ = ctx.upload_new(group_of_row);
    perm_ = ctx.upload_new(m.perm);
    perm_host_ = intern_perm(std::vector<int32_t>(m.perm.begin(), m.perm.end()));
    in_order_ = std::is_sorted(perm_host_->begin(), perm_host_->end());
    std::vector<int32_t> inv(perm_host_->size(), -1);
    for (size_t j = 0; j < perm_host_->size(); ++j) {
      const int32_t p = (*perm_host_)[j];
      EXL_CHECK(p >= 0 && p < K && inv[size_t(p)] < 0, "kernels: cuda: exl2 linear: perm is not a permutation of 0..",
                K - 1, " (entry ", j, " = ", p, ")");
      inv[size_t(p)] = int32_t(j);
    }
    inv_perm_ = std::make_shared<const Buffer>(ctx.upload_new(inv));
    if (n_segs > 0) {
      std::vector<int32_t> at(static_cast<size_t>(K));
      exl2_mma_stage_map(groups.data(), group_of_row.data(), perm_host_->data(), int(K), at.data());
      stage_at_ = ctx.upload_new(at);
      std::vector<int32_t> from(static_cast<size_t>(exl2_mma_stage_gather_entries(int(K))));
      exl2_mma_stage_gather_map(groups.data(), group_of_row.data(), perm_host_->data(), int(K), from.data());
      stage_from_ = ctx.upload_new(from);
    }
    bias_ = upload_bias(ctx, m.bias);
    weight_bytes = q_weight_.bytes() + q_scale_.bytes();
    view_.q_weight = static_cast<const uint32_t*>(q_weight_.data());
    view_.q_scale = static_cast<const uint32_t*>(q_scale_.data());
    view_.q_scale_max = static_cast<const uint16_t*>(q_scale_max_.data());
    view_.groups = static_cast<const Exl2GroupDesc*>(groups_.data());
    view_.group_of_row = static_cast<const int32_t*>(group_of_row_.data());
    view_.perm = static_cast<const int32_t*>(perm_.data());
    view_.segs = static_cast<const Exl2Segment*>(segs_.data());
    view_.n_segs = n_segs;
    view_.blocks = static_cast<const Exl2Block*>(blocks_.data());
    view_.n_groups = int(G);
    view_.max_bits = std::max_element(groups.begin(), groups.end(), [](const Exl2GroupDesc& a, const Exl2GroupDesc& b) {
                       return a.bits < b.bits;
                     })->bits;
    view_.K = int(K);
    view_.N = int(N);
    view_.Np = int(Np);
  }

  const Exl2DeviceView& view() const { return view_; }
  // [K] exl2_mma_stage_map on the device (null without streamed segments: no tensor-core path).
  const int32_t* stage_at() const { return static_cast<const int32_t*>(stage_at_.data()); }
  // [128 · ⌈K/128⌉] exl2_mma_stage_gather_map on the device (null where stage_at is).
  const int32_t* stage_from() const { return static_cast<const int32_t*>(stage_from_.data()); }
  // Equal permutations are one object (intern_perm), so sharing one is a pointer comparison.
  const std::shared_ptr<const std::vector<int32_t>>& perm_host() const { return perm_host_; }
  const std::shared_ptr<const Buffer>& inv_perm() const { return inv_perm_; }
  // Whether the permutation is the identity (permuted row j holds input feature j).
  bool in_order() const { return in_order_; }

  // Rows up to which run() (exact false) or run_linears (exact true) keep this matrix on one launch
  // of the gemv or tensor-core kernels.
  int64_t set_max_rows(bool exact) const {
    return exact                                    ? k_exl2_exact_gemv_max_rows
           : view_.n_segs > 0 && exl2_mma_enabled()
               ? std::max(k_quant_gemv_max_rows, exl2_mma_max_rows(int64_t(view_.N) * view_.K))
                                                    : k_quant_gemv_max_rows;
  }
  bool calls_cublas(int64_t rows, bool exact) const override {
    return rows > (exact ? k_quant_gemv_max_rows : set_max_rows(false));
  }
  bool fuses(int64_t rows, bool exact) const override {
    return rows <= (exact ? k_quant_gemv_max_rows : set_max_rows(false));
  }
  void run_fused(CudaContext& ctx, const float* x, const float* x_up, float* y, int64_t rows, bool residual, bool exact,
                 const Exl2GemvHandoff* io) const override {
    const Exl2Linear* self[1] = {this};
    float* ys[1] = {y};
    // One and two rows keep the exact gemv form in fused passes (as before the tensor-core path).
    gemv_set(ctx, self, ys, rows, {x, x_up, nullptr, 0.0f, residual, nullptr, io, exact || rows < k_exl2_mma_min_rows});
  }
  const float* bias() const { return bias_.f32(); }

  void run(CudaContext& ctx, const float* x, float* y, int64_t rows) const override {
    const float* bias = bias_.f32();
    if (rows <= set_max_rows(false)) {
      gemv(ctx, x, y, rows, false);
      return;
    }
    dequant_gemm(ctx, x, y, rows, view_.K, view_.N, bias, [&](int n0, int nc, uint16_t* wt) {
      EXL_CUDA_CHECK(exl2_reconstruct(view_, n0, nc, wt, ctx.stream()));
    });
  }

 private:
  int64_t gemv_max_rows() const override { return k_quant_gemv_max_rows; }
  void fill_f32(CudaContext& ctx, int n0, int nc, float* out) const override {
    EXL_CUDA_CHECK(exl2_reconstruct_f32(view_, n0, nc, out, ctx.stream()));
  }

  void run_gemv_exact(CudaContext& ctx, const float* x, float* y, int64_t rows) const override {
    gemv(ctx, x, y, rows, true);
  }

  void gemv(CudaContext& ctx, const float* x, float* y, int64_t rows, bool exact) const {
    const Exl2Linear* self[1] = {this};
    float* ys[1] = {y};
    GemvInput in{x};
    in.exact = exact;
    gemv_set(ctx, self, ys, rows, in);
  }

  Buffer q_weight_, q_scale_, q_scale_max_, groups_, group_of_row_, perm_, segs_, blocks_, stage_at_, stage_from_;
  bool in_order_ = false;
  std::shared_ptr<const std::vector<int32_t>> perm_host_;
  std::shared_ptr<const Buffer> inv_perm_;  // shared with the hand-offs that name it (handoff.h)
  Exl2DeviceView view_;
};

class GptqLinear final : public CudaLinear {
 public:
  GptqLinear(CudaContext& ctx, const GptqMatrix& m) {
    const int64_t K = m.in_features, N = m.out_features, G = m.num_groups;
    check_dims("gptq", K, N);
    EXL_CHECK(K % 8 == 0 && N % 8 == 0 && G > 0 && int64_t(m.g_idx.size()) == K,
              "kernels: cuda: gptq linear: inconsistent matrix [", N, ", ", K, "]");
    in_features = K;
    out_features = N;
    for (int64_t k = 0; k < K; ++k)
      EXL_CHECK(m.g_idx[size_t(k)] >= 0 && m.g_idx[size_t(k)] < G, "kernels: cuda: gptq linear: g_idx[", k, "] = ",
                m.g_idx[size_t(k)], " is outside ", G, " groups");
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return m.g_idx[size_t(a)] < m.g_idx[size_t(b)]; });
    std::vector<int32_t> row_group(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) row_group[size_t(j)] = m.g_idx[size_t(perm[size_t(j)])];
    const bool identity = std::is_sorted(m.g_idx.begin(), m.g_idx.end());
    if (identity) {
      qweight_ = ctx.upload_new(m.qweight, size_t(K / 8 * N) * 4);
    } else {
      std::vector<uint32_t> sorted(size_t(K / 8 * N), 0);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = perm[size_t(j)];
        for (int64_t n = 0; n < N; ++n) {
          const uint32_t q = (m.qweight[(src / 8) * N + n] >> (4 * (src % 8))) & 15u;
          sorted[size_t((j / 8) * N + n)] |= q << (4 * (j % 8));
        }
      }
      qweight_ = ctx.upload_new(sorted);
    }
    qzeros_ = ctx.upload_new(m.qzeros, size_t(G * (N / 8)) * 4);
    scales_ = ctx.upload_new(m.scales, size_t(G * N) * 2);
    row_group_ = ctx.upload_new(row_group);
    perm_ = ctx.upload_new(perm);
    bias_ = upload_bias(ctx, m.bias);
    weight_bytes = qweight_.bytes() + qzeros_.bytes() + scales_.bytes();
    view_.qweight = static_cast<const uint32_t*>(qweight_.data());
    view_.qzeros = static_cast<const uint32_t*>(qzeros_.data());
    view_.scales = static_cast<const uint16_t*>(scales_.data());
    view_.row_group = static_cast<const int32_t*>(row_group_.data());
    view_.perm = static_cast<const int32_t*>(perm_.data());
    view_.zero_add = m.zeros_v2 ? 0 : 1;
    view_.K = int(K);
    view_.N = int(N);
  }

  void run(CudaContext& ctx, const float* x, float* y, int64_t rows) const override {
    const float* bias = bias_.f32();
    if (rows <= k_quant_gemv_max_rows) {
      EXL_CUDA_CHECK(fill_bias(y, bias, int(rows), view_.N, ctx.stream()));
      const int ks = gemv_k_slice(view_.K, view_.N, rows, 4 * ctx.sm_count());
      EXL_CUDA_CHECK(gptq_gemv(view_, x, y, int(rows), ks, ctx.stream()));
      return;
    }
    dequant_gemm(ctx, x, y, rows, view_.K, view_.N, bias, [&](int n0, int nc, uint16_t* wt) {
      EXL_CUDA_CHECK(gptq_reconstruct(view_, n0, nc, wt, ctx.stream()));
    });
  }

 private:
  int64_t gemv_max_rows() const override { return k_quant_gemv_max_rows; }
  void fill_f32(CudaContext& ctx, int n0, int nc, float* out) const override {
    EXL_CUDA_CHECK(gptq_reconstruct_f32(view_, n0, nc, out, ctx.stream()));
  }

  Buffer qweight_, qzeros_, scales_, row_group_, perm_;
  GptqDeviceView view_;
};

class DenseLinear final : public CudaLinear {
 public:
  DenseLinear(CudaContext& ctx, const DenseMatrix& m) {
    const int64_t K = m.in_features, N = m.out_features;
    check_dims("dense", K, N);
    EXL_CHECK(m.dtype == DType::f32 || m.dtype == DType::f16 || m.dtype == DType::bf16,
              "kernels: cuda: dense linear: unsupported weight dtype ", to_string(m.dtype));
    in_features = K;
    out_features = N;
    type_ = m.dtype == DType::f32 ? DenseType::f32 : m.dtype == DType::f16 ? DenseType::f16 : DenseType::bf16;
    w_ = ctx.upload_new(m.data, size_t(K * N) * dtype_size(m.dtype));
    weight_bytes = w_.bytes();
    bias_ = upload_bias(ctx, m.bias);
  }

  void run(CudaContext& ctx, const float* x, float* y, int64_t rows) const override {
    const int K = int(in_features), N = int(out_features);
    const float* bias = bias_.f32();
    if (rows <= k_dense_gemv_max_rows) {
      EXL_CUDA_CHECK(dense_gemv(type_, w_.data(), bias, x, y, int(rows), K, N, ctx.stream()));
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (type_ == DenseType::f32) {
      EXL_CUBLAS_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, N, int(rows), K, &one,
                                   w_.f32(), K, x, K, &zero, y, N));
    } else {
      auto* x16 = static_cast<uint16_t*>(ctx.scratch(Scratch::act16, size_t(rows * K) * 2));
      if (type_ == DenseType::f16) EXL_CUDA_CHECK(to_half(x, x16, rows * K, ctx.stream()));
      else EXL_CUDA_CHECK(to_bf16(x, x16, rows * K, ctx.stream()));
      const cudaDataType_t t = type_ == DenseType::f16 ? CUDA_R_16F : CUDA_R_16BF;
      EXL_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, N, int(rows), K, &one, w_.data(), t, K,
                                    x16, t, K, &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (bias) EXL_CUDA_CHECK(add_bias(y, bias, int(rows), N, ctx.stream()));
  }

 private:
  int64_t gemv_max_rows() const override { return k_dense_gemv_max_rows; }
  void fill_f32(CudaContext& ctx, int n0, int nc, float* out) const override {
    EXL_CUDA_CHECK(dense_columns_f32(type_, w_.data(), int(in_features), n0, nc, out, ctx.stream()));
  }

  DenseType type_ = DenseType::f16;
  Buffer w_;
};

}  // namespace

void CudaLinear::run_exact(CudaContext& ctx, const float* x, float* y, int64_t rows) const {
  if (rows <= gemv_max_rows()) return run_gemv_exact(ctx, x, y, rows);
  const int64_t K = in_features, N = out_features;
  auto* xh = static_cast<uint16_t*>(ctx.scratch(Scratch::act16, size_t(rows * K) * 2));
  auto* xl = static_cast<uint16_t*>(ctx.scratch(Scratch::act16_lo, size_t(rows * K) * 2));
  EXL_CUDA_CHECK(split_half(x, xh, xl, rows * K, ctx.stream()));
  const int64_t nc_max = std::max<int64_t>(128, ctx.dequant_chunk_elems / 2 / K / 128 * 128);
  const int64_t nc = std::min(nc_max, N);
  auto* w32 = static_cast<float*>(ctx.scratch(Scratch::weights32, size_t(K * nc) * 4));
  auto* wh = static_cast<uint16_t*>(ctx.scratch(Scratch::weights16, size_t(K * nc) * 2));
  auto* wl = static_cast<uint16_t*>(ctx.scratch(Scratch::weights16_lo, size_t(K * nc) * 2));
  const float one = 1.0f, zero = 0.0f, lo = 1.0f / k_split_lo_scale;
  auto gemm = [&](int cur, const uint16_t* a, const uint16_t* b, const float* alpha, const float* beta, float* c) {
    EXL_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, cur, int(rows), int(K), alpha, a, CUDA_R_16F,
                                  cur, b, CUDA_R_16F, int(K), beta, c, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  };
  for (int64_t n0 = 0; n0 < N; n0 += nc) {
    const int cur = int(std::min(nc, N - n0));
    fill_f32(ctx, int(n0), cur, w32);
    EXL_CUDA_CHECK(split_half(w32, wh, wl, K * cur, ctx.stream()));
    gemm(cur, wh, xh, &one, &zero, y + n0);
    gemm(cur, wh, xl, &lo, &one, y + n0);
    gemm(cur, wl, xh, &lo, &one, y + n0);
  }
  if (bias_.data()) EXL_CUDA_CHECK(add_bias(y, bias_.f32(), int(rows), int(N), ctx.stream()));
}

namespace {

// The launch of one set (gemv_set): which kernel, its K-slice, and the Exl2GemvSet.
struct SetLaunch {
  bool mma = false;
  int k_slice = 0;
  Exl2GemvSet s;
  // Whether a tensor-core set's K-slice sums run (several slices or stream-K): they can then rotate
  // and store (rope) or stage the next set's input (swiglu_to, norm_to).
  bool summed() const { return s.stream_blocks > 0 || s.jobs[0].w.K > k_slice; }
};

SetLaunch plan_set(CudaContext& ctx, std::span<const Exl2Linear* const> set, std::span<float* const> ys, int64_t rows,
                   const GemvInput& in) {
  const int K = set[0]->view().K;
  int64_t n_total = 0;
  int64_t largest = 0;  // weights of the set's largest matrix: the top set_max_rows() admitted it under
  for (const auto* l : set) n_total += l->view().N, largest = std::max(largest, int64_t(l->view().N) * K);
  SetLaunch r;
  bool mma = exl2_mma_enabled() && !in.exact && rows >= exl2_mma_min_rows(largest) &&
             rows <= exl2_mma_max_rows(largest) && !in.norm_w && !in.rope &&
             !(in.io && (in.io->x_in_order || in.io->inv_perm || in.io->ssq_out));
  int wrows = 0;
  for (const auto* l : set) mma = mma && l->view().n_segs > 0, wrows = std::max(wrows, l->view().max_bits);
  r.mma = mma;
  const int ks = mma ? exl2_mma_k_slice(K, n_total, rows, exl2_mma_target_blocks(ctx, rows, wrows))
                     : exl2_gemv_k_slice(K, n_total, rows, exl2_target_blocks(ctx, rows));
  r.k_slice = ks;
  int64_t slices = ceil_div(K, ks);
  if (mma) {
    int tiles = 0;
    for (const auto* l : set) tiles += exl2_gemv_tiles(l->view().N);
    r.s.stream_blocks =
        exl2_mma_stream_blocks(K, tiles, rows, ks, exl2_mma_target_blocks(ctx, rows, wrows), ctx.mma_form().stream_k);
    if (r.s.stream_blocks) slices = exl2_mma_stream_slots(tiles, int(ceil_div(K, 128)), r.s.stream_blocks);
  }
  const bool split = slices > 1 || r.s.stream_blocks;  // sums written as partials (stream-K: always)
  float* partials =
      split ? static_cast<float*>(ctx.scratch(Scratch::gemv_partials, size_t(slices * rows * n_total) * 4)) : nullptr;
  Exl2GemvSet& s = r.s;
  int tile = 0;
  int64_t part_off = 0;
  for (size_t j = 0; j < set.size(); ++j) {
    const Exl2DeviceView& v = set[j]->view();
    s.jobs[j] = {v, set[j]->bias(), ys[j], partials ? partials + part_off : nullptr, tile};
    tile += exl2_gemv_tiles(v.N);
    part_off += slices * rows * v.N;
  }
  s.n_jobs = int(set.size());
  s.x_up = in.x_up;
  s.norm_w = in.norm_w;
  s.norm_eps = in.norm_eps;
  s.residual = in.residual;
  if (in.rope) s.rope = *in.rope;
  if (in.io) s.io = *in.io;
  s.exact = in.exact;
  return r;
}

void gemv_set(CudaContext& ctx, std::span<const Exl2Linear* const> set, std::span<float* const> ys, int64_t rows,
              const GemvInput& in) {
  const SetLaunch p = plan_set(ctx, set, ys, rows, in);
  const int K = set[0]->view().K;
  if (p.mma) {
    auto* staged = static_cast<uint16_t*>(
        ctx.scratch(Scratch::mma_staged, exl2_mma_staged_bytes(int(rows), K, int(set.size()))));
    EXL_CUDA_CHECK(exl2_mma_set(p.s, in.x, int(rows), p.k_slice, staged, ctx.mma_form(), ctx.stream()));
  } else {
    const int64_t mb = exl2_gemv_rows_per_block(int(rows));
    int64_t tiles = 0;
    for (const auto* l : set) tiles += exl2_gemv_tiles(l->view().N);
    unsigned* counters = ceil_div(K, p.k_slice) > 1 ? ctx.gemv_counters(size_t(tiles * ceil_div(rows, mb))) : nullptr;
    EXL_CUDA_CHECK(exl2_gemv_set(p.s, in.x, int(rows), p.k_slice, counters, ctx.stream()));
  }
}

// The tensor-core set `set` reads at `rows`, fed by its producer: where to write its input.
Exl2MmaStaging staging_of(std::span<const Exl2Linear* const> set, int64_t rows, uint16_t* staged) {
  Exl2MmaStaging st;
  st.staged = staged;
  st.n_jobs = int(set.size());
  st.K = set[0]->view().K;
  st.rows = int(rows);
  st.in_order = true;
  for (size_t j = 0; j < set.size(); ++j) {
    st.at[j] = set[j]->stage_at(), st.from[j] = set[j]->stage_from();
    st.in_order = st.in_order && set[j]->in_order();
  }
  return st;
}

std::vector<const Exl2Linear*> exl2_set(std::span<const CudaLinear* const> ls) {
  std::vector<const Exl2Linear*> set;
  for (const auto* l : ls) {
    const auto* e = dynamic_cast<const Exl2Linear*>(l);
    if (!e) return {};
    set.push_back(e);
  }
  return set;
}

}  // namespace

void run_linears(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x, std::span<float* const> ys,
                 int64_t rows, bool exact) {
  EXL_CHECK(ls.size() == ys.size(), "kernels: cuda: linears: ", ls.size(), " matrices for ", ys.size(), " outputs");
  std::vector<const Exl2Linear*> set;
  std::vector<float*> set_y;
  GemvInput in{x};
  in.exact = exact;
  auto flush = [&] {
    if (!set.empty()) gemv_set(ctx, set, set_y, rows, in);
  };
  for (size_t i = 0; i < ls.size(); ++i) {
    const auto* e = dynamic_cast<const Exl2Linear*>(ls[i]);
    const bool fits = e && rows <= e->set_max_rows(exact);
    if (!fits || set.size() == size_t(k_exl2_gemv_max_jobs) || (!set.empty() && set[0]->view().K != e->view().K)) {
      flush();
      set.clear(), set_y.clear();
    }
    if (fits) {
      set.push_back(e);
      set_y.push_back(ys[i]);
    } else if (exact) {
      ls[i]->run_exact(ctx, x, ys[i], rows);
    } else {
      ls[i]->run(ctx, x, ys[i], rows);
    }
  }
  flush();
}

bool fuse_norm(std::span<const CudaLinear* const> ls, int64_t rows) {
  if (ls.empty() || ls.size() > size_t(k_exl2_gemv_max_jobs) || rows > k_norm_gemv_max_rows) return false;
  for (const auto* l : ls) {
    const auto* e = dynamic_cast<const Exl2Linear*>(l);
    if (!e || e->view().K != ls[0]->in_features) return false;
  }
  return true;
}

HandoffPerm handoff_perm(std::span<const CudaLinear* const> set, int64_t rows) {
  if (set.empty() || rows < 1 || rows > k_handoff_max_rows || set[0]->in_features % 4 != 0) return {};
  const auto* first = dynamic_cast<const Exl2Linear*>(set[0]);
  if (!first) return {};
  for (const auto* l : set) {
    const auto* e = dynamic_cast<const Exl2Linear*>(l);
    if (!e || e->perm_host() != first->perm_host()) return {};
  }
  return {first->perm_host(), first->inv_perm(), static_cast<const int32_t*>(first->inv_perm()->data())};
}

void run_linears_normed(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x, const float* norm_w,
                        float eps, std::span<float* const> ys, int64_t rows, const Exl2RopeKv* rope,
                        const Exl2GemvHandoff* io) {
  EXL_CHECK(fuse_norm(ls, rows) && ls.size() == ys.size(), "kernels: cuda: normed linears: ", ls.size(),
            " matrices at ", rows, " rows cannot share one gemv");
  std::vector<const Exl2Linear*> set;
  for (const auto* l : ls) set.push_back(static_cast<const Exl2Linear*>(l));
  EXL_CHECK(!rope || (ls.size() == 3 && ls[0]->out_features % k_exl2_gemv_cols_per_block == 0 &&
                      ls[1]->out_features == ls[2]->out_features && rope->layout.head_dim == k_exl2_gemv_cols_per_block),
            "kernels: cuda: normed linears: rope and cache store need q, k, v of ", k_exl2_gemv_cols_per_block,
            "-wide heads");
  gemv_set(ctx, set, ys, rows, {x, nullptr, norm_w, eps, false, rope, io});
}

bool mma_serves(std::span<const CudaLinear* const> ls, int64_t rows) {
  const std::vector<const Exl2Linear*> set = exl2_set(ls);
  if (set.empty() || set.size() > size_t(k_exl2_gemv_max_jobs) || !exl2_mma_enabled()) return false;
  int64_t largest = 0;
  for (const auto* l : set) {
    if (l->view().K != set[0]->view().K || l->view().n_segs < 1 || rows > l->set_max_rows(false)) return false;
    largest = std::max(largest, int64_t(l->view().N) * l->view().K);
  }
  return rows >= exl2_mma_min_rows(largest) && rows <= exl2_mma_max_rows(largest);
}

void run_linears_norm_staged(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x,
                             const float* norm_w, float eps, std::span<float* const> ys, int64_t rows,
                             const Exl2RopeKv* rope, bool prestaged) {
  EXL_CHECK(mma_serves(ls, rows) && ls.size() == ys.size(), "kernels: cuda: normed linears: ", ls.size(),
            " matrices at ", rows, " rows are not one tensor-core set");
  constexpr int D = k_exl2_gemv_cols_per_block;
  EXL_CHECK(!rope || (ls.size() == 3 && ls[0]->out_features % D == 0 && ls[1]->out_features == ls[2]->out_features &&
                      rope->layout.head_dim == D && ls[1]->out_features == int64_t(rope->layout.n_kv_heads) * D),
            "kernels: cuda: normed linears: rope and cache store need q, k, v of ", D, "-wide heads");
  const std::vector<const Exl2Linear*> set = exl2_set(ls);
  const int K = set[0]->view().K;
  SetLaunch p = plan_set(ctx, set, ys, rows, {nullptr, nullptr, nullptr, 0.0f, false, nullptr, nullptr, false});
  EXL_CHECK(p.mma, "kernels: cuda: normed linears: the tensor-core kernel does not take ", rows, " rows");
  auto* staged =
      static_cast<uint16_t*>(ctx.scratch(Scratch::mma_staged, exl2_mma_staged_bytes(int(rows), K, int(set.size()))));
  if (!prestaged) EXL_CUDA_CHECK(rms_norm_stage(x, norm_w, rows, K, eps, staging_of(set, rows, staged), ctx.stream()));
  const bool summed = p.summed();  // the K-slice sums rotate and store
  if (rope && summed) p.s.rope = *rope;
  EXL_CUDA_CHECK(exl2_mma_set(p.s, nullptr, int(rows), p.k_slice, staged, ctx.mma_form(), ctx.stream()));
  if (rope && !summed)
    EXL_CUDA_CHECK(rope_qk_store(ys[0], ys[1], ys[2], rows, int(ls[0]->out_features / D), rope->layout.n_kv_heads, D,
                                 rope->positions, rope->inv_freq, rope->attn_factor, rope->pool, rope->layout,
                                 rope->slots, ctx.stream()));
}

Exl2MmaStaging mma_staging_of(CudaContext& ctx, const CudaLinear& l, int64_t rows, size_t bytes) {
  const CudaLinear* ls[1] = {&l};
  const std::vector<const Exl2Linear*> set = exl2_set(ls);
  EXL_CHECK(mma_serves(ls, rows), "kernels: cuda: staging: a ", l.out_features, "x", l.in_features,
            " linear at ", rows, " rows is not a tensor-core set");
  return staging_of(set, rows, static_cast<uint16_t*>(ctx.scratch(Scratch::mma_staged, bytes)));
}

size_t layer_output_staged_bytes(const StagedLayerOutput& a) {
  const int rows = int(a.rows), H = int(a.gate->in_features), I = int(a.down->in_features);
  size_t bytes = std::max(exl2_mma_staged_bytes(rows, H, 2), exl2_mma_staged_bytes(rows, I, 1));
  if (a.o) bytes = std::max(bytes, exl2_mma_staged_bytes(rows, int(a.o->in_features), 1));
  if (!a.next.empty()) bytes = std::max(bytes, exl2_mma_staged_bytes(rows, H, int(a.next.size())));
  return bytes;
}

void run_layer_output_staged(CudaContext& ctx, const StagedLayerOutput& a) {
  const CudaLinear* o_ls[1] = {a.o};
  const CudaLinear* gu_ls[2] = {a.gate, a.up};
  const CudaLinear* down_ls[1] = {a.down};
  const int64_t rows = a.rows, H = a.gate->in_features;
  EXL_CHECK(mma_serves(gu_ls, rows) && mma_serves(down_ls, rows) && a.gate->out_features == a.up->out_features &&
                a.down->in_features == a.gate->out_features && a.down->out_features == H &&
                (!a.o || (mma_serves(o_ls, rows) && a.o->out_features == H && a.att)) &&
                (a.next.empty() || (mma_serves(a.next, rows) && a.next[0]->in_features == H && a.next_norm_w)),
            "kernels: cuda: layer output: o, gate/up, down and next at ", rows,
            " rows are not tensor-core sets of matching shapes");
  const std::vector<const Exl2Linear*> os = a.o ? exl2_set(o_ls) : std::vector<const Exl2Linear*>{},
                                       gu = exl2_set(gu_ls), dn = exl2_set(down_ls), nx = exl2_set(a.next);
  auto* staged = static_cast<uint16_t*>(ctx.scratch(Scratch::mma_staged, layer_output_staged_bytes(a)));
  cudaStream_t stream = ctx.stream();
  // A residual set ending the chain's step: its sums stage rms_norm(x) ⊙ norm_w for `reader`, or a
  // norm kernel does after it where it has one K-slice.
  const auto residual_then_norm = [&](SetLaunch p, const float* in, const float* norm_w,
                                      std::span<const Exl2Linear* const> reader) {
    const Exl2MmaStaging to = staging_of(reader, rows, staged);
    const bool summed = p.summed();
    if (summed)
      p.s.norm_to = to, p.s.norm_to_w = norm_w, p.s.norm_to_eps = a.eps, p.s.norm_to_counters = ctx.gemv_counters(size_t(rows));
    EXL_CUDA_CHECK(exl2_mma_set(p.s, in, int(rows), p.k_slice, staged, ctx.mma_form(), stream));
    if (!summed) EXL_CUDA_CHECK(rms_norm_stage(a.x, norm_w, rows, H, a.eps, to, stream));
  };
  float* x_y[1] = {a.x};
  if (a.o)
    residual_then_norm(plan_set(ctx, os, x_y, rows, {a.att, nullptr, nullptr, 0.0f, true, nullptr, nullptr, false}),
                       a.att_staged ? nullptr : a.att, a.norm_w, gu);
  else
    EXL_CUDA_CHECK(rms_norm_stage(a.x, a.norm_w, rows, H, a.eps, staging_of(gu, rows, staged), stream));
  float* gu_y[2] = {a.g, a.u};
  const SetLaunch pg = plan_set(ctx, gu, gu_y, rows, {nullptr, nullptr, nullptr, 0.0f, false, nullptr, nullptr, false});
  SetLaunch pd = plan_set(ctx, dn, x_y, rows, {a.g, a.u, nullptr, 0.0f, true, nullptr, nullptr, false});
  EXL_CHECK(pg.mma && pd.mma, "kernels: cuda: mlp: the tensor-core kernel does not take ", rows, " rows");
  Exl2GemvSet s = pg.s;
  const bool chained = pg.summed();  // the sums then stage the down input
  if (chained) s.swiglu_to = staging_of(dn, rows, staged), pd.s.x_up = nullptr;
  EXL_CUDA_CHECK(exl2_mma_set(s, nullptr, int(rows), pg.k_slice, staged, ctx.mma_form(), stream));
  const float* down_in = chained ? nullptr : a.g;
  if (nx.empty())
    EXL_CUDA_CHECK(exl2_mma_set(pd.s, down_in, int(rows), pd.k_slice, staged, ctx.mma_form(), stream));
  else
    residual_then_norm(pd, down_in, a.next_norm_w, nx);
}

int gemv_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks) {
  const int64_t mb = gemv_rows_per_block(int(std::min<int64_t>(rows, 8)));
  const int64_t base = ceil_div(N, k_gemv_cols_per_block) * ceil_div(rows, mb);
  const int64_t splits = std::max<int64_t>(1, ceil_div(target_blocks, base));
  int64_t ks = ceil_div(ceil_div(K, splits), 32) * 32;
  ks = std::clamp<int64_t>(ks, 64, 1024);
  return int(std::min(ks, ceil_div(K, 32) * 32));
}

int exl2_gemv_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks) {
  const int64_t mb = exl2_gemv_rows_per_block(int(std::min<int64_t>(rows, 8)));
  const int64_t base = ceil_div(N, k_exl2_gemv_cols_per_block) * ceil_div(rows, mb);
  const int64_t splits = std::max<int64_t>(1, target_blocks / base);
  int64_t ks = ceil_div(ceil_div(K, splits), 128) * 128;
  ks = std::clamp<int64_t>(ks, 128, 1024);
  return int(std::min(ks, ceil_div(K, 32) * 32));
}

int exl2_mma_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks) {
  const int64_t mb = exl2_mma_rows_per_block(int(rows));
  const int64_t base = ceil_div(N, int64_t(k_exl2_gemv_cols_per_block)) * ceil_div(rows, mb);
  const int64_t splits = std::max<int64_t>(1, target_blocks / base);
  const int64_t ks = std::clamp<int64_t>(ceil_div(ceil_div(K, splits), 128) * 128, 128, 4096);
  return int(std::min(ks, ceil_div(K, 128) * 128));
}

int exl2_mma_stream_blocks(int64_t K, int64_t tiles, int64_t rows, int k_slice, int target_blocks, int mode) {
  if (mode <= 0 || rows > 64) return 0;
  const int64_t units = tiles * ceil_div(K, 128);
  if (mode > 1) return int(std::min<int64_t>(mode, units));
  const int64_t blocks = tiles * ceil_div(K, k_slice), waves = ceil_div(blocks, target_blocks);
  if (5 * blocks >= 4 * waves * target_blocks || units < 2 * target_blocks) return 0;
  return target_blocks;
}

namespace {

// EXL_CUDA_MMA: unset = the measured range, 1 = every row count the kernel takes, 0 = never.
int exl2_mma_mode() {
  static const int mode = int(env_int("EXL_CUDA_MMA", -1));
  return mode;
}

}  // namespace

bool exl2_mma_enabled() { return exl2_mma_mode() != 0; }

int64_t exl2_mma_min_rows(int64_t weights) {
  static const int64_t n = [] {
    const int64_t v = env_int("EXL_CUDA_MMA_MIN_ROWS", 0);
    return v >= k_exl2_mma_min_rows && v <= 16 ? v : 0;
  }();
  if (n > 0) return n;
  return exl2_mma_mode() == 1 || weights <= k_exl2_mma_small_weights ? k_exl2_mma_min_rows : k_exl2_mma_auto_min_rows;
}

int64_t exl2_mma_max_rows(int64_t weights) {
  static const int64_t n = [] {
    const int64_t v = env_int("EXL_CUDA_MMA_MAX_ROWS", 0);
    return v >= 16 && v <= 4096 ? v : 0;
  }();
  if (n > 0) return n;
  if (weights <= k_exl2_mma_small_weights) return k_exl2_mma_small_max_rows;
  return exl2_mma_mode() == 1 ? k_exl2_mma_max_rows : k_exl2_mma_auto_max_rows;
}

int exl2_mma_target_blocks(const CudaContext& ctx, int64_t rows, int wrows) {
  static const int n = [] {
    const int v = int(env_int("EXL_CUDA_MMA_BLOCKS_PER_SM", 0));
    return v > 0 && v <= 64 ? v : 0;
  }();
  return (n > 0 ? n : exl2_mma_resident_blocks(int(rows), wrows, ctx.mma_form(), ctx.shared_per_sm())) *
         ctx.sm_count();
}

void gemv_walk_only_from_env() {
  static const bool once = [] {
    exl2_gemv_walk_only(env_int("EXL_CUDA_GEMV_WALK", 0) == 1);
    return true;
  }();
  (void)once;
}

int gemv_blocks_per_sm(int64_t rows) {
  gemv_walk_only_from_env();
  static const int n = [] {
    const int v = int(env_int("EXL_CUDA_GEMV_BLOCKS_PER_SM", 0));
    return v > 0 && v <= 64 ? v : 0;
  }();
  return n > 0 ? n : rows <= 2 ? 8 : 4;
}

std::unique_ptr<CudaLinear> prepare_cuda_linear(CudaContext& ctx, const LinearWeights& w) {
  ctx.make_current();
  if (const auto* e = std::get_if<Exl2Matrix>(&w)) return std::make_unique<Exl2Linear>(ctx, *e);
  if (const auto* g = std::get_if<GptqMatrix>(&w)) return std::make_unique<GptqLinear>(ctx, *g);
  return std::make_unique<DenseLinear>(ctx, std::get<DenseMatrix>(w));
}

}  // namespace exl::cuda
