#include "kernels/cuda/handoff.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/env_switch.h"

namespace exl::cuda {

namespace {

constexpr Scratch k_areas[3] = {Scratch::handoff_a, Scratch::handoff_b, Scratch::handoff_c};

uint32_t bit(Scratch s) { return 1u << (int(s) - int(Scratch::handoff_a)); }

}  // namespace

Handoff::Handoff(CudaContext& ctx) : ctx_(ctx) {
  enabled_ = !env_is("EXL_CUDA_HANDOFF", "0");
}

void Handoff::begin_step() {
  last_ = {};
  reading_ = 0;
  if (ctx_.frees() != frees_seen_) norm_perm_.clear();  // a norm's address may now hold other weights
  for (const auto& [key, r] : learned_) readers_[key] = r;
  learned_.clear();
  for (const auto& [w, r] : norms_wanted_) {
    const auto key = std::make_pair(w, r.perm.inv_perm);
    if (norm_perm_.count(key)) continue;
    const std::vector<int32_t>& perm = *r.perm.perm;
    std::vector<float> h(perm.size()), p(perm.size());
    ctx_.sync();
    EXL_CUDA_CHECK(cudaMemcpy(h.data(), w, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < perm.size(); ++j) p[j] = h[size_t(perm[j])];
    norm_perm_[key] = {ctx_.upload_new(p), r.perm.inv};
  }
  norms_wanted_.clear();
  frees_seen_ = ctx_.frees();
}

Handoff::In Handoff::read(std::span<const CudaLinear* const> set, const float* x, const float* up,
                          const float* norm_w, int64_t rows) {
  const Last prev = std::exchange(last_, {});
  reading_ = 0;
  In in;
  if (!prev.key.first || prev.staged || prev.x != x || prev.up != up || prev.rows != rows || set.empty()) return in;
  const HandoffPerm hp = handoff_perm(set, rows);
  if (!hp.inv_perm || set[0]->in_features != prev.n) return in;
  const Reader want{hp, prev.n, norm_w != nullptr};
  const auto known = readers_.find(prev.key);
  if (known == readers_.end() || known->second.perm.inv_perm != hp.inv_perm || known->second.ssq != want.ssq)
    learned_[prev.key] = want;
  const float* nw = nullptr;
  if (norm_w) {
    const auto it = norm_perm_.find({norm_w, hp.inv_perm});
    if (it == norm_perm_.end()) {
      norms_wanted_.emplace_back(norm_w, want);
      return in;
    }
    nw = it->second.w.f32();
  }
  if (prev.out.inv_perm != hp.inv_perm || (norm_w && !prev.out.ssq)) return in;
  in.ok = true;
  ++reads_;
  in.x = prev.out.x;
  in.up = prev.out.up;
  in.norm_w = nw;
  in.io.x_in_order = true;
  if (norm_w) {
    in.io.ssq = prev.out.ssq;
    in.io.ssq_parts = exl2_gemv_tiles(int(prev.n));
  }
  reading_ = bit(prev.area_x) | (up ? bit(prev.area_up) : 0u);
  return in;
}

Handoff::Out Handoff::produce(Key key, const float* x, const float* up, int64_t n, int64_t rows, bool able) {
  Last l;
  l.key = key;
  l.x = x;
  l.up = up;
  l.n = n;
  l.rows = rows;
  const auto it = readers_.find(key);
  Scratch free[3];
  size_t n_free = 0;
  for (Scratch a : k_areas)
    if (!(reading_ & bit(a))) free[n_free++] = a;
  if (enabled_ && able && rows <= k_handoff_max_rows && it != readers_.end() && it->second.n == n && n_free >= (up ? 2u : 1u)) {
    const size_t bytes = size_t(rows * n) * sizeof(float);
    l.area_x = free[0];
    l.out.inv_perm = it->second.perm.inv_perm;
    l.out.x = static_cast<float*>(ctx_.scratch(l.area_x, bytes));
    if (up) {
      l.area_up = free[1];
      l.out.up = static_cast<float*>(ctx_.scratch(l.area_up, bytes));
    }
    if (it->second.ssq) {
      const int64_t tiles = exl2_gemv_tiles(int(n));
      l.out.ssq = static_cast<double*>(ctx_.scratch(Scratch::handoff_ssq, size_t(rows * tiles) * sizeof(double)));
    }
  }
  last_ = l;
  reading_ = 0;
  return l.out;
}

void Handoff::produce_staged(Key key, const float* x, const float* norm_w, std::span<const void* const> reader,
                             int64_t rows, size_t bytes) {
  last_ = {};
  reading_ = 0;
  if (reader.empty() || reader.size() > size_t(k_exl2_gemv_max_jobs)) return;
  last_.key = key;
  last_.x = x;
  last_.rows = rows;
  last_.staged = true;
  last_.staged_norm_w = norm_w;
  std::copy(reader.begin(), reader.end(), last_.staged_reader);
  last_.staged_bytes = bytes;
}

bool Handoff::read_staged(const float* x, const float* norm_w, std::span<const void* const> reader, int64_t rows,
                          size_t need) {
  const Last prev = std::exchange(last_, {});
  reading_ = 0;
  if (!prev.staged || prev.x != x || prev.staged_norm_w != norm_w || prev.rows != rows || prev.staged_bytes < need ||
      reader.size() > size_t(k_exl2_gemv_max_jobs))
    return false;
  for (size_t j = 0; j < size_t(k_exl2_gemv_max_jobs); ++j)
    if (prev.staged_reader[j] != (j < reader.size() ? reader[j] : nullptr)) return false;
  ++reads_;
  return true;
}

Handoff::Key Handoff::producer_of(const float* x, int64_t rows) const {
  if (last_.x != x || last_.rows != rows) return {nullptr, 0};
  return last_.key;
}

}  // namespace exl::cuda
