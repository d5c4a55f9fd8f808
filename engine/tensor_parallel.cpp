#include "engine/tensor_parallel.h"

#include <algorithm>

#include "engine/formats/linear_loader.h"
#include "kernels/error.h"

namespace exl {

namespace {

// [r·n/N, (r+1)·n/N) in units of `unit`, the last range taking the remainder.
std::pair<int64_t, int64_t> even_range(int64_t n, int64_t unit, int r, int N) {
  const int64_t blocks = (n + unit - 1) / unit;
  const int64_t b = blocks * r / N, e = blocks * (r + 1) / N;
  return {std::min(n, b * unit), std::min(n, e * unit)};
}

// Boundaries of a row split of `m` into N ranges at group starts, each near an even share.
std::vector<int64_t> group_cuts(const Exl2Matrix& m, int N, std::string_view name) {
  const int64_t G = int64_t(m.groups.size()), K = m.in_features;
  EXL_CHECK(G >= N, "engine: tensor parallel: '", name, "' has ", G, " groups, fewer than ", N, " ranks");
  std::vector<int64_t> cuts{0};
  int64_t g = 0;
  for (int r = 1; r < N; ++r) {
    const int64_t target = K * r / N;
    int64_t best = std::max(g + 1, int64_t(1));
    for (int64_t c = best; c <= G - (N - r); ++c)
      if (std::llabs(m.groups[size_t(c)].row_start - target) < std::llabs(m.groups[size_t(best)].row_start - target))
        best = c;
    g = best;
    cuts.push_back(m.groups[size_t(g)].row_start);
  }
  cuts.push_back(K);
  return cuts;
}

// Device bytes of `w`'s slice of n output columns, without copying its data.
int64_t column_slice_bytes(const LinearWeights& w, int64_t n) {
  if (const auto* e = std::get_if<Exl2Matrix>(&w)) {
    Exl2Matrix m;
    m.in_features = e->in_features, m.out_features = n, m.padded_out = (n + 31) / 32 * 32, m.q_rows = e->q_rows;
    m.groups = e->groups;
    m.bias.resize(e->bias.empty() ? 0 : size_t(n));
    return linear_device_bytes(m);
  }
  const auto* d = std::get_if<DenseMatrix>(&w);
  EXL_CHECK(d != nullptr, "engine: tensor parallel: GPTQ weights are not split (EXL2 and dense weights are)");
  DenseMatrix m = *d;
  m.out_features = n;
  m.bias.resize(d->bias.empty() ? 0 : size_t(n));
  return linear_device_bytes(m);
}

}  // namespace

MemoryPlan plan_tp_memory(const ModelDir& dir, const TpPlan& plan, const MemoryRequest& req,
                          std::span<const std::optional<DeviceMemory>> memory) {
  const int N = plan.n_ranks;
  EXL_CHECK(int(memory.size()) == N, "engine: tensor parallel: memory of ", memory.size(), " devices for ", N, " ranks");
  const ModelConfig& c = dir.config();
  const int64_t D = c.head_dim;
  MemoryPlan whole = plan_memory(dir, req, std::nullopt);  // checks the options, sizes the replicated parts
  std::vector<int64_t> weights(size_t(N), whole.embedding_bytes + whole.norm_bytes), kv_heads(size_t(N), 0);
  const LinearSpec head = head_linear(c);
  weights[0] += linear_device_bytes(load_linear(dir, head.name, head.in_features, head.out_features));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::vector<LinearSpec> specs = decoder_layer_linears(c, l);
    std::vector<LinearWeights> w;
    for (const LinearSpec& s : specs) w.push_back(load_linear(dir, s.name, s.in_features, s.out_features));
    for (int r = 0; r < N; ++r) {
      const TpLayerSlice& s = plan.slices[size_t(l)][size_t(r)];
      const int64_t qd = (s.q_head_end - s.q_head_begin) * D, kvd = (s.kv_head_end - s.kv_head_begin) * D;
      const int64_t mlp = int64_t(s.mlp_cols.size());
      weights[size_t(r)] += column_slice_bytes(w[0], qd) + column_slice_bytes(w[1], kvd) + column_slice_bytes(w[2], kvd) +
                            column_slice_bytes(w[3], s.o_col_end - s.o_col_begin) + column_slice_bytes(w[4], mlp) +
                            column_slice_bytes(w[5], mlp) +
                            linear_device_bytes(slice_linear_rows(w[6], s.down_row_begin, s.down_row_end, r == 0).weights);
      kv_heads[size_t(r)] += s.kv_head_end - s.kv_head_begin;
    }
  }
  MemoryPlan best;
  for (int r = 0; r < N; ++r) {
    // One rank's plan: the whole plan's arithmetic with this rank's weights and page size.
    MemoryPlan p = whole;
    p.device = memory[size_t(r)];
    p.weight_bytes = weights[size_t(r)];
    p.linear_bytes = p.weight_bytes - p.embedding_bytes - p.norm_bytes;
    KvLayout one;
    one.n_layers = 1, one.n_kv_heads = 1, one.head_dim = int(D), one.page_size = req.page_size, one.format = req.cache_format;
    p.page_bytes = kv_heads[size_t(r)] * int64_t(one.page_bytes());
    p.margin_bytes = p.device ? k_margin_fixed + int64_t(p.device->total_bytes / 100) : 0;
    int64_t pages = req.cache_pages;
    p.fits = true;
    if (pages == 0) {
      const int64_t min_pages = std::min<int64_t>(
          p.max_pages, (std::min<int64_t>(p.request.max_seq_len, req.max_step_tokens) + req.page_size - 1) / req.page_size);
      pages = p.device ? std::clamp<int64_t>((int64_t(p.device->free_bytes) - p.weight_bytes - p.scratch_bytes -
                                              p.margin_bytes) / (p.page_bytes + req.companion_page_bytes),
                                             0, p.max_pages)
                       : std::min<int64_t>(p.max_pages, req.cpu_default_pages);
      if (pages < min_pages) pages = min_pages, p.fits = false;
    }
    p.cache_pages = int(pages);
    p.cache_tokens = pages * req.page_size;
    p.cache_bytes = pages * (p.page_bytes + req.companion_page_bytes);
    if (p.device && p.total_bytes() + p.margin_bytes > int64_t(p.device->free_bytes)) p.fits = false;
    if (!p.fits)
      p.error = cat("engine: tensor parallel: memory plan: rank ", r, " of model '", p.model, "' needs ",
                    format_bytes(p.weight_bytes), " of weights + ", format_bytes(p.cache_bytes), " of cache (",
                    p.cache_tokens, " tokens, ", to_string(p.cache_format), ") + ", format_bytes(p.scratch_bytes),
                    " of scratch, but device ", p.device->device, " has ", format_bytes(int64_t(p.device->free_bytes)),
                    " free (", format_bytes(p.margin_bytes), " of it kept as a safety margin)");
    const bool worse = r == 0 || (!p.fits && best.fits) || (p.fits == best.fits && p.cache_pages < best.cache_pages);
    if (worse) best = p;
  }
  return best;
}

TpPlan plan_tensor_parallel(const ModelDir& dir, int N) {
  const ModelConfig& c = dir.config();
  EXL_CHECK(N >= 1, "engine: tensor parallel: ", N, " ranks (at least 1)");
  const int64_t NKV = c.num_kv_heads, group = c.num_heads / c.num_kv_heads, H = c.hidden_size;
  EXL_CHECK(NKV >= N, "engine: tensor parallel: ", NKV, " kv heads cannot be split over ", N, " ranks");
  EXL_CHECK((H + 31) / 32 >= N, "engine: tensor parallel: hidden size ", H, " has fewer 32-column blocks than ", N,
            " ranks");
  TpPlan p;
  p.n_ranks = N;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LinearSpec down = decoder_layer_linears(c, l)[6];
    const LinearWeights w = load_linear(dir, down.name, down.in_features, down.out_features);
    std::vector<int64_t> cuts;
    const Exl2Matrix* e = std::get_if<Exl2Matrix>(&w);
    if (e) {
      cuts = group_cuts(*e, N, down.name);
    } else {
      EXL_CHECK(std::holds_alternative<DenseMatrix>(w), "engine: tensor parallel: '", down.name,
                "' is GPTQ, which is not split (EXL2 and dense weights are)");
      EXL_CHECK((down.in_features + 31) / 32 >= N, "engine: tensor parallel: '", down.name, "' has fewer 32-row blocks than ",
                N, " ranks");
      for (int r = 0; r <= N; ++r) cuts.push_back(r < N ? even_range(down.in_features, 32, r, N).first : down.in_features);
    }
    std::vector<TpLayerSlice> ranks(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) {
      TpLayerSlice& s = ranks[size_t(r)];
      s.kv_head_begin = NKV * r / N, s.kv_head_end = NKV * (r + 1) / N;
      s.q_head_begin = s.kv_head_begin * group, s.q_head_end = s.kv_head_end * group;
      std::tie(s.o_col_begin, s.o_col_end) = even_range(H, 32, r, N);
      s.down_row_begin = cuts[size_t(r)], s.down_row_end = cuts[size_t(r) + 1];
      for (int64_t j = s.down_row_begin; j < s.down_row_end; ++j) s.mlp_cols.push_back(e ? e->perm[size_t(j)] : int32_t(j));
    }
    p.slices.push_back(std::move(ranks));
  }
  return p;
}

}  // namespace exl
