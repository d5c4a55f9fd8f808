#include "engine/layer_split.h"

#include <algorithm>

#include "engine/formats/linear_loader.h"
#include "kernels/error.h"
#include "kernels/int_math.h"

namespace exl {

namespace {

int64_t split_resolved_seq_len(const ModelConfig& c, const MemoryRequest& r) {
  if (r.max_seq_len > 0) return r.max_seq_len;
  return c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
}

// Bytes of layer l on its device at `pages` pages: weights, cache, and what rides with the first
// and last layers.
int64_t layer_cost(const SplitSizes& s, int64_t l, int64_t pages) {
  const int64_t n = int64_t(s.layer_bytes.size());
  int64_t c = s.layer_bytes[size_t(l)] + pages * s.layer_page_bytes;
  if (l == 0) c += s.embedding_bytes + pages * s.companion_page_bytes;
  if (l == n - 1) c += s.head_bytes;
  return c;
}

struct SplitAttempt {
  bool placed = false;
  int64_t first_unplaced = 0;  // when !placed
  std::vector<std::pair<int64_t, int64_t>> ranges;  // per device
  std::vector<int64_t> bytes;                       // per device
};

// Greedy in-order fill at `pages` pages; contiguous ranges, so greedy is optimal for feasibility.
SplitAttempt try_split(const SplitSizes& s, const std::vector<int64_t>& budgets, int64_t pages) {
  const size_t nd = budgets.size();
  const int64_t nl = int64_t(s.layer_bytes.size());
  SplitAttempt a;
  a.ranges.assign(nd, {0, 0});
  a.bytes.assign(nd, 0);
  size_t d = 0;
  for (int64_t l = 0; l < nl; ++l) {
    const int64_t cost = layer_cost(s, l, pages);
    for (;; ++d) {
      if (d == nd) {
        a.first_unplaced = l;
        return a;
      }
      const bool empty = a.ranges[d].second == a.ranges[d].first;
      const int64_t need = a.bytes[d] + (empty ? s.scratch_bytes : 0) + cost;
      if (budgets[d] < 0 || need <= budgets[d]) {
        if (empty) a.ranges[d] = {l, l};
        a.ranges[d].second = l + 1;
        a.bytes[d] = need;
        break;
      }
    }
  }
  a.placed = true;
  return a;
}

std::vector<std::pair<int64_t, int64_t>> equal_ranges(int64_t n_layers, size_t nd) {
  std::vector<std::pair<int64_t, int64_t>> r(nd);
  int64_t b = 0;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t n = n_layers / int64_t(nd) + (int64_t(d) < n_layers % int64_t(nd) ? 1 : 0);
    r[d] = {b, b + n};
    b += n;
  }
  return r;
}

std::string memory_text(const DevicePlacement& d) {
  std::string t = d.budget_bytes < 0 ? "no bound" : cat(format_bytes(d.budget_bytes), " budget");
  if (d.memory)
    t += cat(": ", format_bytes(int64_t(d.memory->free_bytes)), " free of ", format_bytes(int64_t(d.memory->total_bytes)),
             ", ", format_bytes(d.margin_bytes), " kept as a margin");
  return t;
}

}  // namespace

std::vector<std::pair<int, std::pair<int64_t, int64_t>>> LayerPlacement::used_ranges() const {
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> r;
  for (const DevicePlacement& d : devices)
    if (d.used()) r.push_back({d.device, {d.layer_begin, d.layer_end}});
  return r;
}

int64_t layer_weight_bytes(const ModelDir& dir, int64_t layer) {
  const ModelConfig& c = dir.config();
  int64_t b = 2 * device_alloc_bytes(c.hidden_size * 4);
  for (const LinearSpec& s : decoder_layer_linears(c, layer))
    b += linear_device_bytes(load_linear(dir, s.name, s.in_features, s.out_features));
  return b;
}

LayerPlacement place_layers(const SplitSizes& s, const MemoryRequest& req, const GpuSplit& split,
                            std::span<const std::optional<DeviceMemory>> memory, std::string_view model) {
  const size_t nd = size_t(split.n_devices);
  EXL_CHECK(nd > 0, "engine: layer split: a split needs at least one device");
  EXL_CHECK(split.gb.empty() || split.gb.size() == nd, "engine: layer split: ", split.gb.size(), " sizes for ", nd,
            " devices");
  EXL_CHECK(memory.size() == nd, "engine: layer split: memory of ", memory.size(), " devices for a split of ", nd);
  EXL_CHECK(!s.layer_bytes.empty(), "engine: layer split: the model has no decoder layers");
  EXL_CHECK(req.page_size > 0 && req.cache_pages >= 0 && req.max_seq_len > 0 && req.max_step_tokens > 0 &&
                req.max_batch_seqs > 0,
            "engine: layer split: page size, sequence length, step tokens and batch must be positive");
  for (double g : split.gb)
    EXL_CHECK(g > 0, "engine: layer split: device memory of ", g, " GB (each device needs a positive size)");

  LayerPlacement p;
  p.model = std::string(model);
  p.request = req;
  p.cache_format = req.cache_format;
  p.n_layers = int64_t(s.layer_bytes.size());
  bool any_memory = false;
  std::vector<int64_t> budgets(nd, -1);
  p.devices.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    DevicePlacement& dp = p.devices[d];
    dp.device = int(d);
    dp.memory = memory[d];
    if (!split.gb.empty()) budgets[d] = int64_t(split.gb[d] * double(int64_t(1) << 30));
    if (memory[d]) {
      any_memory = true;
      dp.margin_bytes = k_margin_fixed + int64_t(memory[d]->total_bytes / 100);
      const int64_t avail = std::max<int64_t>(0, int64_t(memory[d]->free_bytes) - dp.margin_bytes);
      budgets[d] = budgets[d] < 0 ? avail : std::min(budgets[d], avail);
    }
    dp.budget_bytes = budgets[d];
  }

  const int64_t id_limit = ((int64_t(1) << 31) - 1) / req.page_size;
  p.max_pages = std::min(id_limit, int64_t(req.max_batch_seqs) * ceil_div(req.max_seq_len, req.page_size));
  const int64_t min_pages =
      std::min(p.max_pages, ceil_div(std::min<int64_t>(req.max_seq_len, req.max_step_tokens), req.page_size));
  const bool bounded = std::any_of(budgets.begin(), budgets.end(), [](int64_t b) { return b >= 0; });
  const int64_t cap = any_memory ? p.max_pages : std::min<int64_t>(p.max_pages, req.cpu_default_pages);

  int64_t pages = req.cache_pages;
  p.cache_auto = pages == 0;
  SplitAttempt a;
  if (!bounded) {
    if (p.cache_auto) pages = cap;
    a.placed = true;
    a.ranges = equal_ranges(p.n_layers, nd);
  } else if (!p.cache_auto) {
    a = try_split(s, budgets, pages);
  } else {
    a = try_split(s, budgets, min_pages);
    pages = min_pages;
    if (a.placed) {
      int64_t lo = min_pages, hi = cap;  // lo fits
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (try_split(s, budgets, mid).placed) lo = mid;
        else hi = mid - 1;
      }
      pages = lo;
      a = try_split(s, budgets, pages);
    }
  }
  p.cache_pages = int(pages);
  p.cache_tokens = pages * req.page_size;

  for (size_t d = 0; d < nd; ++d) {
    DevicePlacement& dp = p.devices[d];
    std::tie(dp.layer_begin, dp.layer_end) = a.ranges[d];
    if (!dp.used()) continue;
    dp.embedding = dp.layer_begin == 0;
    dp.head = dp.layer_end == p.n_layers;
    dp.scratch_bytes = s.scratch_bytes;
    for (int64_t l = dp.layer_begin; l < dp.layer_end; ++l) dp.weight_bytes += s.layer_bytes[size_t(l)];
    if (dp.embedding) dp.weight_bytes += s.embedding_bytes;
    if (dp.head) dp.weight_bytes += s.head_bytes;
    dp.page_bytes = (dp.layer_end - dp.layer_begin) * s.layer_page_bytes + (dp.embedding ? s.companion_page_bytes : 0);
    dp.cache_bytes = pages * dp.page_bytes;
  }
  if (!a.placed) {
    p.fits = false;
    const int64_t l0 = a.first_unplaced;
    int64_t weights = 0;
    for (int64_t l = l0; l < p.n_layers; ++l) weights += layer_cost(s, l, 0);
    const int64_t cache = (p.n_layers - l0) * pages * s.layer_page_bytes + (l0 == 0 ? pages * s.companion_page_bytes : 0);
    const DevicePlacement& last = p.devices.back();
    const int64_t held = last.used() ? a.bytes.back() : 0;
    p.error = cat("engine: layer split: model '", p.model, "' does not fit ", nd, nd == 1 ? " device" : " devices",
                  ": layers ", l0, "..", p.n_layers - 1, " are left over, needing ", format_bytes(weights),
                  " of weights + ", format_bytes(cache), " of cache (", pages, " pages of ", req.page_size,
                  " tokens, ", to_string(req.cache_format), p.cache_auto ? ", the smallest automatic cache" : "",
                  ") + ", format_bytes(s.scratch_bytes), " of scratch on a fresh device, but device ", last.device,
                  ", the last, has ", format_bytes(std::max<int64_t>(0, last.budget_bytes - held)), " left (",
                  memory_text(last), ", ", format_bytes(held), " placed); give the devices more (--gpu-split), ",
                  p.cache_auto ? "use more devices or a shorter step" : "or lower the cache size");
  }
  return p;
}

LayerPlacement plan_layer_split(const ModelDir& dir, const MemoryRequest& req, const GpuSplit& split,
                                std::span<const std::optional<DeviceMemory>> memory) {
  const ModelConfig& c = dir.config();
  MemoryRequest r = req;
  r.max_seq_len = split_resolved_seq_len(c, req);
  SplitSizes s;
  for (int64_t l = 0; l < c.num_layers; ++l) s.layer_bytes.push_back(layer_weight_bytes(dir, l));
  const TensorView emb = dir.require("model.embed_tokens.weight");
  s.embedding_bytes = device_alloc_bytes(c.vocab_size * c.hidden_size * int64_t(dtype_size(emb.info->dtype)));
  const LinearSpec head = head_linear(c);
  s.head_bytes = device_alloc_bytes(c.hidden_size * 4) +
                 linear_device_bytes(load_linear(dir, head.name, head.in_features, head.out_features));
  s.scratch_bytes = scratch_reserve_bytes(c, r);
  KvLayout one;
  one.n_layers = 1;
  one.n_kv_heads = int(c.num_kv_heads);
  one.head_dim = int(c.head_dim);
  one.page_size = r.page_size;
  one.format = r.cache_format;
  s.layer_page_bytes = int64_t(one.page_bytes());
  s.companion_page_bytes = r.companion_page_bytes;
  return place_layers(s, r, split, memory, dir.path().string());
}

void check_fits(const LayerPlacement& placement) {
  if (!placement.fits) fail(placement.error);
}

std::string describe(const LayerPlacement& p) {
  std::string s = cat("split          ", p.devices.size(), " devices, ", p.n_layers, " decoder layers\n");
  for (const DevicePlacement& d : p.devices) {
    s += cat("device ", d.device, "       ");
    if (!d.used()) {
      s += cat("unused (", memory_text(d), ")\n");
      continue;
    }
    s += cat("layers ", d.layer_begin, "..", d.layer_end - 1, d.embedding ? " + embedding" : "",
             d.head ? " + head" : "", ": ", format_bytes(d.weight_bytes), " weights + ", format_bytes(d.cache_bytes),
             " cache + ", format_bytes(d.scratch_bytes), " scratch = ", format_bytes(d.total_bytes()), " (",
             memory_text(d), ")\n");
  }
  s += cat("kv cache       ", p.cache_pages, " pages of ", p.request.page_size, " tokens = ", p.cache_tokens,
           " tokens, ", to_string(p.cache_format), " on every device for its layers");
  if (p.cache_auto) s += cat(" (automatic, at most ", p.max_pages, " pages)");
  s += "\n";
  s += p.fits ? "total          fits\n" : "total          does NOT fit\n" + p.error + "\n";
  return s;
}

}  // namespace exl
