// GptqDevice on CUDA (kernels/gptq_device.h): cuBLAS SSYRK for the Hessian chunks, a blocked
// Cholesky (kGptqCholeskyBlock-wide diagonal blocks factored on the host in double, the panels by
// cuBLAS DTRSM, the trailing matrix by DSYRK) and DTRSM for the factor, gptq_quant.cu's kernels
// per group and a cuBLAS SGEMM for the lazy update of the rows after each group. cuBLAS only:
// cuSOLVER would add 400 MB of libraries (libcusolver, libcusparse, libnvJitLink) to every binary
// that links the kernels.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/gptq_quant.h"
#include "kernels/gptq_device.h"

namespace exl {

namespace cuda_gptq_impl {

constexpr int64_t kGptqCholeskyBlock = 128;

// In place: the lower Cholesky factor of the SPD block a [n, n] (column-major, leading dimension
// n; the upper part is left as it is); false when it is not numerically positive definite.
bool gptq_cholesky_block(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[size_t(j + j * n)];
    for (int64_t k = 0; k < j; ++k) d -= a[size_t(j + k * n)] * a[size_t(j + k * n)];
    if (!(d > 0) || !std::isfinite(d)) return false;
    d = std::sqrt(d);
    a[size_t(j + j * n)] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      double v = a[size_t(i + j * n)];
      for (int64_t k = 0; k < j; ++k) v -= a[size_t(i + k * n)] * a[size_t(j + k * n)];
      a[size_t(i + j * n)] = v / d;
    }
  }
  return true;
}

class CudaGptqHessian final : public GptqDeviceHessian {
 public:
  Buffer h;  // [dim, dim] double
};

class CudaGptqFactor final : public GptqDeviceFactor {
 public:
  Buffer u;         // [dim, dim] float
  Buffer perm;      // [dim] int32
  Buffer dead_row;  // [dim] uint8, by permuted row
};

class CudaGptqWeight final : public GptqDeviceWeight {
 public:
  Buffer w;  // [N, K] float
};

// A device area that only grows (contents not kept).
struct Area {
  Buffer buf;
  template <typename T>
  T* get(const cuda::CudaContext& ctx, size_t n) {
    if (buf.bytes() < n * sizeof(T)) {
      buf.reset();
      buf = ctx.alloc(std::max<size_t>(n * sizeof(T), 1));
    }
    return static_cast<T*>(buf.data());
  }
};

class CudaGptqDevice final : public GptqDevice {
 public:
  explicit CudaGptqDevice(int device) : ctx_(device) {}

  std::unique_ptr<GptqDeviceHessian> make_hessian(int64_t dim) override {
    EXL_CHECK(dim > 0, "kernels: cuda: gptq: Hessian of dimension ", dim);
    auto h = std::make_unique<CudaGptqHessian>();
    h->dim = dim;
    h->h = ctx_.alloc(size_t(dim * dim) * sizeof(double));
    EXL_CUDA_CHECK(cudaMemsetAsync(h->h.data(), 0, h->h.bytes(), ctx_.stream()));
    return h;
  }

  void accumulate(GptqDeviceHessian& hb, const float* x, int64_t rows) override { add_rows(hb, x, rows, false); }
  void accumulate_resident(GptqDeviceHessian& hb, const float* x, int64_t rows) override {
    add_rows(hb, x, rows, true);
  }

  void add_rows(GptqDeviceHessian& hb, const float* x, int64_t rows, bool resident) {
    auto& h = as<CudaGptqHessian>(hb);
    const int64_t K = h.dim;
    ctx_.make_current();
    float* staged = resident ? nullptr : x_.get<float>(ctx_, size_t(std::min(rows, kGptqHessianChunkRows) * K));
    float* c = c_.get<float>(ctx_, size_t(K * K));
    const float one = 1.0f, zero = 0.0f;
    for (int64_t t0 = 0; t0 < rows; t0 += kGptqHessianChunkRows) {
      const int64_t n = std::min(kGptqHessianChunkRows, rows - t0);
      const float* xd = resident ? x + t0 * K : staged;
      if (!resident)
        EXL_CUDA_CHECK(cudaMemcpyAsync(staged, x + t0 * K, size_t(n * K) * sizeof(float), cudaMemcpyHostToDevice,
                                       ctx_.stream()));
      // Row-major x [n, K] is column-major [K, n]; C = X·Xᵀ there, its lower triangle (column-major)
      // being the row-major upper one.
      EXL_CUBLAS_CHECK(cublasSsyrk(ctx_.cublas(), CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, int(K), int(n), &one, xd,
                                   int(K), &zero, c, int(K)));
      EXL_CUDA_CHECK(cuda::gptq_hessian_add(static_cast<double*>(h.h.data()), c, K, ctx_.stream()));
    }
    h.rows += rows;
    ctx_.sync();
  }

  std::vector<double> diag(const GptqDeviceHessian& hb) override {
    const auto& h = as<CudaGptqHessian>(hb);
    ctx_.make_current();
    double* d = d_.get<double>(ctx_, size_t(h.dim));
    EXL_CUDA_CHECK(cuda::gptq_hessian_diag(static_cast<const double*>(h.h.data()), d, h.dim, ctx_.stream()));
    std::vector<double> out(size_t(h.dim));
    download(out.data(), d, out.size() * sizeof(double));
    return out;
  }

  std::unique_ptr<GptqDeviceFactor> factor(const GptqDeviceHessian& hb, std::span<const int32_t> perm,
                                           std::span<const uint8_t> dead, double damp) override {
    const auto& h = as<CudaGptqHessian>(hb);
    const int64_t K = h.dim;
    EXL_CHECK(int64_t(perm.size()) == K && int64_t(dead.size()) == K, "kernels: cuda: gptq: a permutation of ",
              perm.size(), " and ", dead.size(), " dead flags for a Hessian of dimension ", K);
    ctx_.make_current();
    auto f = std::make_unique<CudaGptqFactor>();
    f->dim = K;
    std::vector<uint8_t> dead_row(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) dead_row[size_t(j)] = dead[size_t(perm[size_t(j)])];
    f->perm = ctx_.upload_new(perm.data(), perm.size_bytes());
    f->dead_row = ctx_.upload_new(dead_row);
    const Buffer dead_d = ctx_.upload_new(dead.data(), dead.size_bytes());
    double* a = a_.get<double>(ctx_, size_t(K * K));
    double* b = b_.get<double>(ctx_, size_t(K * K));
    EXL_CUDA_CHECK(cuda::gptq_factor_build(static_cast<const double*>(h.h.data()), static_cast<const int32_t*>(f->perm.data()),
                                           static_cast<const uint8_t*>(dead_d.data()), damp, a, b, K, ctx_.stream()));
    if (!cholesky_lower(a, K)) return nullptr;
    int* bad = flags_.get<int>(ctx_, 1);
    EXL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), ctx_.stream()));
    const double one = 1.0;
    EXL_CUBLAS_CHECK(cublasDtrsm(ctx_.cublas(), CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,
                                 CUBLAS_DIAG_NON_UNIT, int(K), int(K), &one, a, int(K), b, int(K)));
    f->u = ctx_.alloc(size_t(K * K) * sizeof(float));
    EXL_CUDA_CHECK(cuda::gptq_factor_extract(b, f->u.f32(), bad, K, ctx_.stream()));
    int host_bad = 0;
    download(&host_bad, bad, sizeof(int));
    if (host_bad != 0) return nullptr;
    return f;
  }

  std::vector<float> factor_u(const GptqDeviceFactor& fb) override {
    const auto& f = as<CudaGptqFactor>(fb);
    std::vector<float> out(size_t(f.dim * f.dim));
    download(out.data(), f.u.data(), out.size() * sizeof(float));
    return out;
  }

  std::unique_ptr<GptqDeviceWeight> upload_weight(std::span<const float> w, int64_t N, int64_t K) override {
    EXL_CHECK(N > 0 && K > 0 && int64_t(w.size()) == N * K, "kernels: cuda: gptq: weight of ", w.size(),
              " values for a ", N, "x", K, " layer");
    auto out = std::make_unique<CudaGptqWeight>();
    out->out_features = N;
    out->in_features = K;
    out->w = ctx_.upload_new(w.data(), w.size_bytes());
    return out;
  }

  GptqDeviceCodes quantize(const GptqDeviceWeight& wb, const GptqDeviceFactor& fb,
                           std::span<const Exl2Group> groups) override {
    const auto& w = as<CudaGptqWeight>(wb);
    const auto& f = as<CudaGptqFactor>(fb);
    const int64_t N = w.out_features, K = w.in_features, Np = (N + 31) / 32 * 32, G = int64_t(groups.size());
    EXL_CHECK(f.dim == K && G > 0, "kernels: cuda: gptq: a ", N, "x", K, " weight, a factor of dimension ", f.dim,
              " and ", G, " groups");
    int64_t q_rows = 0, covered = 0, max_rows = 0;
    for (const auto& g : groups) {
      EXL_CHECK(g.row_start == covered && g.rows > 0 && g.rows <= 128 && g.qrow_start == q_rows && g.rows * g.bits % 32 == 0,
                "kernels: cuda: gptq: group at row ", g.row_start, " of ", g.rows, " rows (at most 128, contiguous) "
                "does not follow the layout");
      covered += g.rows, q_rows += g.rows * g.bits / 32, max_rows = std::max(max_rows, g.rows);
    }
    EXL_CHECK(covered == K, "kernels: cuda: gptq: groups cover ", covered, " of ", K, " rows");
    ctx_.make_current();
    cudaStream_t s = ctx_.stream();
    float* rows = rows_.get<float>(ctx_, size_t(K * N));
    EXL_CUDA_CHECK(cuda::gptq_gather_rows(w.w.f32(), static_cast<const int32_t*>(f.perm.data()),
                                          static_cast<const uint8_t*>(f.dead_row.data()), rows, N, K, s));
    float* base = base_.get<float>(ctx_, size_t(N));
    uint8_t* qscale = qscale_.get<uint8_t>(ctx_, size_t(N));
    double* partial = partial_.get<double>(ctx_, size_t(cuda::gptq_group_grid_blocks(int(N)) * cuda::k_gptq_grid_points));
    float* err = err_.get<float>(ctx_, size_t(max_rows * N));
    unsigned* smax_bits = smax_bits_.get<unsigned>(ctx_, size_t(G));
    float* smax = smax_.get<float>(ctx_, size_t(G));
    int* bad = flags_.get<int>(ctx_, 2);
    Buffer q_weight = ctx_.alloc(size_t(q_rows * Np) * 4), q_scale = ctx_.alloc(size_t(G * Np / 8) * 4),
           q_scale_max = ctx_.alloc(size_t(G) * 2);
    EXL_CUDA_CHECK(cudaMemsetAsync(smax_bits, 0, size_t(G) * sizeof(unsigned), s));
    EXL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
    const float* U = f.u.f32();
    const float minus_one = -1.0f, one = 1.0f;
    for (int64_t g = 0; g < G; ++g) {
      const Exl2Group& gr = groups[size_t(g)];
      const int64_t r0 = gr.row_start, r1 = r0 + gr.rows;
      int n_blocks = 0;
      EXL_CUDA_CHECK(cuda::gptq_group_colmax(rows, r0, int(gr.rows), int(N), gr.bits, base, smax_bits + g, s));
      EXL_CUDA_CHECK(cuda::gptq_group_grid(rows, r0, int(gr.rows), int(N), gr.bits, base, smax_bits + g, qscale,
                                           partial, &n_blocks, s));
      EXL_CUDA_CHECK(cuda::gptq_group_pick(partial, n_blocks, smax_bits + g,
                                           static_cast<uint16_t*>(q_scale_max.data()) + g, smax + g, bad, s));
      EXL_CUDA_CHECK(cuda::gptq_group_quantize(rows, U, K, r0, int(gr.rows), int(N), int(Np), gr.bits, gr.qrow_start,
                                               qscale, smax + g, err, static_cast<uint32_t*>(q_weight.data()),
                                               static_cast<uint32_t*>(q_scale.data()) + g * (Np / 8), s));
      if (r1 < K) {
        // rows[r1:, :] −= U[r0:r1, r1:]ᵀ · err, column-major: C [N, K − r1] −= E [N, gr] · B, with
        // B [gr, K − r1] the transpose of the column-major view of U at (r0, r1).
        EXL_CUBLAS_CHECK(cublasSgemm(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, int(N), int(K - r1), int(gr.rows),
                                     &minus_one, err, int(N), U + r0 * K + r1, int(K), &one, rows + r1 * N, int(N)));
      }
    }
    GptqDeviceCodes out;
    out.q_weight.resize(size_t(q_rows * Np));
    out.q_scale.resize(size_t(G * Np / 8));
    out.q_scale_max.resize(size_t(G));
    int host_bad = 0;
    download(out.q_weight.data(), q_weight.data(), q_weight.bytes());
    download(out.q_scale.data(), q_scale.data(), q_scale.bytes());
    download(out.q_scale_max.data(), q_scale_max.data(), q_scale_max.bytes());
    download(&host_bad, bad, sizeof(int));
    EXL_CHECK(!host_bad, "kernels: cuda: gptq: a group maximum of a ", N, "x", K,
              " layer is outside the fp16 range (weights too large for EXL2 scales)");
    return out;
  }

 private:
  template <typename T, typename B>
  static const T& as(const B& b) {
    const T* p = dynamic_cast<const T*>(&b);
    EXL_CHECK(p, "kernels: cuda: gptq: an object of another GptqDevice");
    return *p;
  }
  template <typename T, typename B>
  static T& as(B& b) {
    T* p = dynamic_cast<T*>(&b);
    EXL_CHECK(p, "kernels: cuda: gptq: an object of another GptqDevice");
    return *p;
  }
  // In place: the lower Cholesky factor of the symmetric a [k, k] (column-major) in its lower
  // triangle, right-looking by blocks; false when a is not numerically positive definite.
  bool cholesky_lower(double* a, int64_t K) {
    std::vector<double> blk;
    const double one = 1.0, minus_one = -1.0;
    for (int64_t j0 = 0; j0 < K; j0 += kGptqCholeskyBlock) {
      const int64_t jb = std::min(kGptqCholeskyBlock, K - j0), rest = K - j0 - jb;
      double* djj = a + j0 + j0 * K;
      blk.resize(size_t(jb * jb));
      EXL_CUDA_CHECK(cudaMemcpy2DAsync(blk.data(), size_t(jb) * sizeof(double), djj, size_t(K) * sizeof(double),
                                       size_t(jb) * sizeof(double), size_t(jb), cudaMemcpyDeviceToHost, ctx_.stream()));
      ctx_.sync();
      if (!gptq_cholesky_block(blk, jb)) return false;
      EXL_CUDA_CHECK(cudaMemcpy2DAsync(djj, size_t(K) * sizeof(double), blk.data(), size_t(jb) * sizeof(double),
                                       size_t(jb) * sizeof(double), size_t(jb), cudaMemcpyHostToDevice, ctx_.stream()));
      if (rest == 0) break;
      double* a21 = djj + jb;  // rows j0 + jb.., columns j0..j0 + jb
      // A21 := A21 · L11⁻ᵀ, then A22 −= A21 · A21ᵀ (lower triangle).
      EXL_CUBLAS_CHECK(cublasDtrsm(ctx_.cublas(), CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                                   CUBLAS_DIAG_NON_UNIT, int(rest), int(jb), &one, djj, int(K), a21, int(K)));
      EXL_CUBLAS_CHECK(cublasDsyrk(ctx_.cublas(), CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, int(rest), int(jb), &minus_one,
                                   a21, int(K), &one, a21 + jb * K, int(K)));
    }
    return true;
  }

  void download(void* dst, const void* src, size_t bytes) {
    EXL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.sync();
  }

  cuda::CudaContext ctx_;
  Area x_, c_, d_, a_, b_, flags_, rows_, base_, qscale_, partial_, err_, smax_bits_, smax_;
};

}  // namespace cuda_gptq_impl

std::unique_ptr<GptqDevice> make_cuda_gptq_device(int device) {
  return std::make_unique<cuda_gptq_impl::CudaGptqDevice>(device);
}

}  // namespace exl
