#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/layer_split.h"
#include "engine/memory_plan.h"
#include "engine/tensor_parallel.h"
#include "engine/formats/model_dir.h"
#include "engine/model_summary.h"
#include "runtime/backend_select.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return cat(b, " (", fmt(u ? "%.2f" : "%.0f", v), " ", units[u], ")");
}

std::string bits_text(const LinearSummary& s) {
  std::string t;
  for (auto it = s.rows_per_bits.rbegin(); it != s.rows_per_bits.rend(); ++it)
    t += cat(t.empty() ? "" : " ", it->first, "b:", it->second);
  return t;
}

std::string format_text(const LinearSummary& s) {
  return s.format == WeightFormat::dense ? cat("dense ", to_string(s.dtype)) : to_string(s.format);
}

std::string rope_text(const RopeConfig& r) {
  std::string t = cat(to_string(r.type), ", theta ", r.theta);
  if (r.type != RopeType::default_) t += cat(", factor ", r.factor);
  if (r.type == RopeType::llama3)
    t += cat(", low/high freq factor ", r.low_freq_factor, "/", r.high_freq_factor);
  if (r.original_max_position_embeddings) t += cat(", original max positions ", r.original_max_position_embeddings);
  return t;
}

void print_text(const ModelSummary& s, std::ostream& os) {
  const ModelConfig& c = s.config;
  os << "model          " << s.path << "\n"
     << "architecture   " << c.architecture << " (" << to_string(c.arch) << ")\n"
     << "layers         " << c.num_layers << "\n"
     << "dims           hidden " << c.hidden_size << ", intermediate " << c.intermediate_size << ", heads "
     << c.num_heads << ", kv heads " << c.num_kv_heads << ", head_dim " << c.head_dim << ", vocab "
     << c.vocab_size << "\n"
     << "rope           " << rope_text(c.rope) << "\n";
  if (!c.quant_method.empty())
    os << "quantization   " << c.quant_method << " (config: bits " << c.quant_bits << ", head_bits "
       << c.quant_head_bits << ")\n";
  os << "avg bpw        " << fmt("%.3f", s.avg_bpw_layers) << " (decoder layers)\n"
     << "head           " << s.head.tensor_prefix << ": " << format_text(s.head) << ", " << s.head_bits
     << " bits, " << fmt("%.3f", s.head_bpw) << " bpw [" << bits_text(s.head) << "]\n"
     << "weight bytes   " << human_bytes(s.weight_bytes) << " in " << s.num_tensors << " tensors\n"
     << "kv cache / 1k  fp16 " << human_bytes(s.kv_cache_per_1k.fp16) << ", q8 "
     << human_bytes(s.kv_cache_per_1k.q8) << ", q4 " << human_bytes(s.kv_cache_per_1k.q4) << "\n\n";
  std::string header = "layer  linear            format     in x out          bpw  bits (rows per width)\n";
  os << header;
  for (size_t l = 0; l < s.layers.size(); ++l)
    for (const auto& ls : s.layers[l]) {
      std::string name = ls.name.substr(ls.name.rfind('.', ls.name.rfind('.') - 1) + 1);
      char line[160];
      std::snprintf(line, sizeof line, "%-6zu %-17s %-10s %-15s %6.3f  ", l, name.c_str(), format_text(ls).c_str(),
                    cat(ls.in_features, " x ", ls.out_features).c_str(), ls.bpw);
      os << line << bits_text(ls) << (ls.has_bias ? "  +bias" : "") << "\n";
    }
}

nlohmann::ordered_json memory_plan_json(const MemoryPlan& p) {
  nlohmann::ordered_json j = {{"weight_bytes", p.weight_bytes},
                              {"embedding_bytes", p.embedding_bytes},
                              {"norm_bytes", p.norm_bytes},
                              {"linear_bytes", p.linear_bytes},
                              {"scratch_bytes", p.scratch_bytes},
                              {"cache_pages", p.cache_pages},
                              {"cache_tokens", p.cache_tokens},
                              {"cache_bytes", p.cache_bytes},
                              {"cache_format", to_string(p.cache_format)},
                              {"cache_auto", p.cache_auto},
                              {"fits", p.fits}};
  if (p.device)
    j["device"] = {{"index", p.device->device},
                   {"free_bytes", p.device->free_bytes},
                   {"total_bytes", p.device->total_bytes},
                   {"margin_bytes", p.margin_bytes}};
  if (!p.fits) j["error"] = p.error;
  return j;
}

nlohmann::ordered_json layer_split_json(const LayerPlacement& p) {
  nlohmann::ordered_json devs = nlohmann::ordered_json::array();
  for (const DevicePlacement& d : p.devices) {
    nlohmann::ordered_json j = {{"index", d.device},
                                {"layer_begin", d.layer_begin},
                                {"layer_end", d.layer_end},
                                {"embedding", d.embedding},
                                {"head", d.head},
                                {"budget_bytes", d.budget_bytes},
                                {"weight_bytes", d.weight_bytes},
                                {"scratch_bytes", d.scratch_bytes},
                                {"cache_bytes", d.cache_bytes},
                                {"total_bytes", d.total_bytes()}};
    if (d.memory)
      j["memory"] = {{"free_bytes", d.memory->free_bytes},
                     {"total_bytes", d.memory->total_bytes},
                     {"margin_bytes", d.margin_bytes}};
    devs.push_back(std::move(j));
  }
  nlohmann::ordered_json j = {{"devices", devs},
                              {"cache_pages", p.cache_pages},
                              {"cache_tokens", p.cache_tokens},
                              {"cache_format", to_string(p.cache_format)},
                              {"cache_auto", p.cache_auto},
                              {"fits", p.fits}};
  if (!p.fits) j["error"] = p.error;
  return j;
}

}  // namespace

int cli_info(std::span<const std::string> args) {
  static const CommandSpec spec{
      "info",
      "Describe a model directory: architecture, dims, per-layer weight format and bit widths, average bits per "
      "weight of the decoder layers and the head, weight bytes and KV-cache bytes per 1k tokens. With --backend,\n"
      "also the memory plan `serve` would load with on that backend: device bytes of the weights, scratch\n"
      "reserve and KV cache against the device's free memory; with --gpu-split, the layer placement:\n"
      "which decoder layers (and embedding, head) each device holds, and its bytes; with\n"
      "--tensor-parallel N, the plan of the rank with the least room.",
      {"MODEL_DIR"},
      {{"--json", "", "print one JSON object instead of the table"},
       {"--backend", "NAME", "plan the memory for cpu or cuda"},
       {"--gpu-split", "GB,GB...|auto", "with --backend: plan a layer split over devices (GB per device, or auto) and "
                                        "show which layers each device holds"},
       {"--tensor-parallel", "N", "with --backend: plan tensor parallelism over N devices (the memory plan of the "
                                  "rank with the least room)"},
       {"--cache-pages", "N", "plan this many KV cache pages of 64 tokens (default: what fits)"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    ModelDir dir(a.positionals[0]);
    ModelSummary s = summarize_model(dir);
    std::optional<MemoryPlan> plan;
    std::optional<LayerPlacement> split;
    if ((a.has("--gpu-split") || a.has("--tensor-parallel")) && !a.has("--backend"))
      throw UsageError("--gpu-split and --tensor-parallel need --backend");
    const int tp = tensor_parallel_flag(a);
    if (a.has("--backend")) {
      const std::string backend = *a.get("--backend");
      MemoryRequest req;
      req.cache_format = default_cache_format(backend);
      req.cache_pages = int(a.get_int("--cache-pages", 0));
      if (req.cache_pages < 0) throw UsageError("--cache-pages must be positive");
      if (tp > 1) {
        GpuSplit ranks;
        ranks.n_devices = tp;
        plan = plan_tp_memory(dir, plan_tensor_parallel(dir, tp), req,
                              device_memories(make_split_backends(backend, ranks, 1, "--tensor-parallel")));
      } else if (const std::string gs = gpu_split_flag(a, backend); !gs.empty()) {
        const GpuSplit gpu_split = parse_gpu_split(gs, backend);
        split = plan_layer_split(dir, req, gpu_split, device_memories(make_split_backends(backend, gpu_split, 1)));
      } else {
        plan = plan_memory(dir, req, make_backend(backend, 1)->device_memory());
      }
    }
    if (a.has("--json")) {
      nlohmann::ordered_json j = to_json(s);
      if (plan) j["memory_plan"] = memory_plan_json(*plan);
      if (split) j["layer_split"] = layer_split_json(*split);
      std::cout << j.dump(2) << "\n";
    } else {
      print_text(s, std::cout);
      if (plan) std::cout << "\nmemory plan\n" << describe(*plan);
      if (split) std::cout << "\nlayer split\n" << describe(*split);
    }
    return (plan && !plan->fits) || (split && !split->fits) ? 1 : 0;
  });
}

}  // namespace exl
