#include "engine/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "engine/formats/linear_loader.h"
#include "engine/model.h"
#include "kernels/error.h"
#include "kernels/int_math.h"

namespace exl {

namespace {

int64_t buf(int64_t bytes) { return device_alloc_bytes(bytes); }

int64_t bias_bytes(const std::vector<float>& bias) { return buf(int64_t(bias.size()) * 4); }

// K slices of the EXL2 gemv over [K, N] for the largest grid (cuda_linear.cpp: exl2_gemv_k_slice,
// whose base grid is at least ceil(N / 128) blocks, so this split count is an upper bound).
int64_t gemv_slices(int64_t K, int64_t N) {
  const int64_t splits = std::max<int64_t>(1, ceil_div(k_max_gemv_blocks, ceil_div(N, 128)));
  int64_t ks = std::clamp<int64_t>(ceil_div(ceil_div(K, splits), 128) * 128, 128, 1024);
  ks = std::min(ks, ceil_div(K, 32) * 32);
  return ceil_div(K, ks);
}

int64_t grown(int64_t bytes) { return bytes + bytes / 4; }

int64_t resolved_seq_len(const ModelConfig& c, const MemoryRequest& r) {
  if (r.max_seq_len > 0) return r.max_seq_len;
  return c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
}

std::string dims_text(const MemoryRequest& r) {
  return cat(r.max_step_tokens, " tokens per step, ", r.max_batch_seqs, " sequences, ", r.max_seq_len,
             " positions per sequence");
}

}  // namespace

int64_t device_alloc_bytes(int64_t bytes) {
  if (bytes <= 0) return 0;
  const int64_t g = bytes >= k_large_page / 2 ? k_large_page : k_alloc_granularity;
  return ceil_div(bytes, g) * g;
}

int64_t linear_device_bytes(const LinearWeights& w) {
  if (const auto* e = std::get_if<Exl2Matrix>(&w)) {
    const int64_t K = e->in_features, Np = e->padded_out, G = int64_t(e->groups.size());
    return buf(e->q_rows * Np * 4) + buf(G * (Np / 8) * 4) + buf(G * 2) + buf(G * 16) + buf(K * 4) + buf(K * 4) +
           bias_bytes(e->bias);
  }
  if (const auto* g = std::get_if<GptqMatrix>(&w)) {
    const int64_t K = g->in_features, N = g->out_features, G = g->num_groups;
    return buf(K / 8 * N * 4) + buf(G * (N / 8) * 4) + buf(G * N * 2) + buf(K * 4) + buf(K * 4) + bias_bytes(g->bias);
  }
  const auto& d = std::get<DenseMatrix>(w);
  return buf(d.in_features * d.out_features * int64_t(dtype_size(d.dtype))) + bias_bytes(d.bias);
}

int64_t scratch_reserve_bytes(const ModelConfig& c, const MemoryRequest& r) {
  EXL_CHECK(r.max_seq_len > 0 && r.max_step_tokens > 0 && r.max_batch_seqs > 0,
            "engine: memory plan: max_seq_len, max_step_tokens and max_batch_seqs must be positive");
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, NH = c.num_heads,
                KVH = c.num_kv_heads, D = c.head_dim, QD = NH * D, KVD = KVH * D;
  const int64_t T = r.max_step_tokens, R = std::min<int64_t>(r.max_batch_seqs, T), S = r.max_seq_len;
  const int64_t kmax = std::max({H, I, QD});
  const int64_t activations = 2 * T * (3 * H + 2 * QD + 2 * KVD + 2 * I) * 4 + 2 * R * (H + V) * 4;
  const int64_t act16 = grown(T * kmax * 2);
  const int64_t dequant = grown(std::max(k_dequant_chunk_elems, 128 * kmax) * 2);
  const std::pair<int64_t, int64_t> sets[] = {{H, QD + 2 * KVD}, {H, 2 * I}, {QD, H}, {I, H}, {H, V}};
  int64_t gemv = 0;
  for (auto [K, N] : sets) gemv = std::max(gemv, N * gemv_slices(K, N));
  gemv = grown(16 * 4 * gemv);
  const int64_t attn_partials = grown((k_max_attn_blocks * 16 + 2 * T * NH) * (2 + D) * 4);
  const int64_t scores = std::min(NH * T * S, std::max(int64_t(256) << 20, 16 * NH * S));
  const int64_t prefill = grown(2 * KVH * S * D * 2 + scores * 6);
  return activations + act16 + dequant + gemv + attn_partials + prefill + k_fixed_runtime_bytes;
}

MemoryPlan plan_memory(const ModelDir& dir, const MemoryRequest& req, const std::optional<DeviceMemory>& device) {
  const ModelConfig& c = dir.config();
  EXL_CHECK(req.page_size > 0 && req.cache_pages >= 0 && req.cpu_default_pages > 0,
            "engine: memory plan: page size and cache pages must be positive (cache pages 0: automatic)");
  MemoryPlan p;
  p.model = dir.path().string();
  p.request = req;
  p.request.max_seq_len = resolved_seq_len(c, req);
  p.cache_format = req.cache_format;
  p.device = device;

  const TensorView emb = dir.require("model.embed_tokens.weight");
  p.embedding_bytes = buf(c.vocab_size * c.hidden_size * int64_t(dtype_size(emb.info->dtype)));
  p.norm_bytes = (2 * c.num_layers + 1) * buf(c.hidden_size * 4);
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const LinearSpec& s : decoder_layer_linears(c, l))
      p.linear_bytes += linear_device_bytes(load_linear(dir, s.name, s.in_features, s.out_features));
  const LinearSpec head = head_linear(c);
  p.linear_bytes += linear_device_bytes(load_linear(dir, head.name, head.in_features, head.out_features));
  p.weight_bytes = p.embedding_bytes + p.norm_bytes + p.linear_bytes;
  p.scratch_bytes = scratch_reserve_bytes(c, p.request);

  KvLayout layout;
  layout.n_layers = int(c.num_layers);
  layout.n_kv_heads = int(c.num_kv_heads);
  layout.head_dim = int(c.head_dim);
  layout.page_size = req.page_size;
  layout.format = req.cache_format;
  p.page_bytes = int64_t(layout.page_bytes());
  EXL_CHECK(p.page_bytes > 0, "engine: memory plan: model '", p.model, "' has an empty KV page");

  // Pages addressable by int32 slot ids (the backends' limit).
  const int64_t id_limit = ((int64_t(1) << 31) - 1) / req.page_size;
  p.max_pages = std::min(id_limit, int64_t(req.max_batch_seqs) * ceil_div(p.request.max_seq_len, req.page_size));
  if (device) p.margin_bytes = k_margin_fixed + int64_t(device->total_bytes / 100);
  int64_t pages = req.cache_pages;
  if (pages == 0) {
    p.cache_auto = true;
    const int64_t min_pages =
        std::min(p.max_pages, ceil_div(std::min<int64_t>(p.request.max_seq_len, req.max_step_tokens), req.page_size));
    if (!device) {
      pages = std::min<int64_t>(p.max_pages, req.cpu_default_pages);
    } else {
      const int64_t left = int64_t(device->free_bytes) - p.weight_bytes - p.scratch_bytes - p.margin_bytes;
      pages = std::clamp<int64_t>(left / (p.page_bytes + req.companion_page_bytes), 0, p.max_pages);
      if (pages < min_pages) {
        pages = min_pages;
        p.fits = false;
      }
    }
  }
  p.cache_pages = int(pages);
  p.cache_tokens = pages * req.page_size;
  p.cache_bytes = pages * (p.page_bytes + req.companion_page_bytes);
  if (device && p.total_bytes() + p.margin_bytes > int64_t(device->free_bytes)) p.fits = false;
  if (!p.fits)
    p.error = cat("engine: memory plan: model '", p.model, "' needs ", format_bytes(p.weight_bytes), " of weights + ",
                  format_bytes(p.cache_bytes), " of cache (", p.cache_tokens, " tokens, ", to_string(p.cache_format),
                  p.cache_auto ? ", the smallest automatic cache" : "", ") + ", format_bytes(p.scratch_bytes),
                  " of scratch, but device ", device->device, " has ", format_bytes(int64_t(device->free_bytes)),
                  " free (", format_bytes(p.margin_bytes), " of it kept as a safety margin); ",
                  p.cache_auto ? "use a smaller model or a shorter step"
                               : "lower the cache size, or leave it unset to fit the free memory");
  return p;
}

void check_fits(const MemoryPlan& plan) {
  if (!plan.fits) fail(plan.error);
}

std::unique_ptr<Model> load_planned_model(const ModelDir& dir, Backend& backend, const MemoryRequest& req,
                                          MemoryPlan& plan) {
  plan = plan_memory(dir, req, backend.device_memory());
  check_fits(plan);
  return std::make_unique<Model>(dir, backend);
}

std::string format_bytes(int64_t bytes) {
  char b[64];
  const double v = double(bytes);
  if (bytes >= (int64_t(1) << 30)) std::snprintf(b, sizeof b, "%.2f GiB", v / double(int64_t(1) << 30));
  else if (bytes >= (int64_t(1) << 20)) std::snprintf(b, sizeof b, "%.1f MiB", v / double(1 << 20));
  else if (bytes >= 1024) std::snprintf(b, sizeof b, "%.1f KiB", v / 1024.0);
  else std::snprintf(b, sizeof b, "%lld B", static_cast<long long>(bytes));
  return b;
}

std::string describe(const MemoryPlan& p) {
  std::string s;
  if (p.device)
    s += cat("device         ", p.device->device, ": ", format_bytes(int64_t(p.device->free_bytes)), " free of ",
             format_bytes(int64_t(p.device->total_bytes)), "\n");
  else
    s += "device         none (host memory: nothing to check)\n";
  s += cat("weights        ", format_bytes(p.weight_bytes), " (embedding ", format_bytes(p.embedding_bytes),
           ", norms ", format_bytes(p.norm_bytes), ", linears ", format_bytes(p.linear_bytes), ")\n");
  s += cat("scratch        ", format_bytes(p.scratch_bytes), " (", dims_text(p.request), ")\n");
  s += cat("kv cache       ", format_bytes(p.cache_bytes), ": ", p.cache_pages, " pages of ", p.request.page_size,
           " tokens = ", p.cache_tokens, " tokens, ", to_string(p.cache_format),
           p.request.companion_page_bytes > 0 ? ", with the draft model's" : "");
  if (p.cache_auto)
    s += cat(p.device ? " (automatic: the free memory left" : " (automatic: the host default",
             ", at most ", p.max_pages, " pages)");
  s += "\n";
  if (p.device)
    s += cat("margin         ", format_bytes(p.margin_bytes), "\n",
             "total          ", format_bytes(p.total_bytes()), (p.fits ? " (fits)" : " (does NOT fit)"), "\n");
  if (!p.fits) s += p.error + "\n";
  return s;
}

}  // namespace exl
