#include <fstream>

#include "engine/layer_split.h"
#include "engine/model.h"
#include "kernels/communicator.h"
#include "engine/formats/model_dir.h"
#include "runtime/backend_select.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

namespace {

const CommandSpec& logits_spec() {
  static const CommandSpec s{
      "logits",
      "Run token ids through the model and write float32 little-endian logits, shape [len(ids), vocab],\n"
      "one row per position. --mode prefill runs all ids at once, decode one token per step, chunked:N\n"
      "N tokens per step. --gpu-split and --tensor-parallel run it over several devices (compare the\n"
      "files with one device's).",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--ids-json", "FILE", "JSON file holding {\"input_ids\": [...]}", true},
       {"--out", "FILE", "output file", true},
       {"--mode", "MODE", "prefill (default), decode or chunked:N"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--gpu-split", "GB,GB...|auto", k_gpu_split_help},
       {"--tensor-parallel", "N", k_tensor_parallel_help},
       {"--cache", "FORMAT", "KV cache format: f32 (cpu default), fp16 (cuda default), q8, q4"},
       {"--threads", "N", "CPU threads (default: all)"}}};
  return s;
}

}  // namespace

int cli_logits(std::span<const std::string> args) {
  return run_command(logits_spec(), args, [](const ParsedArgs& a) {
    const std::string backend_name = a.get_or("--backend", "cpu");
    std::string mode = a.get_or("--mode", "prefill");
    int64_t chunk = 0;
    if (mode == "prefill") chunk = 0;
    else if (mode == "decode") chunk = 1;
    else if (mode.starts_with("chunked:")) {
      try {
        chunk = std::stoll(mode.substr(8));
      } catch (const std::exception&) {
        chunk = -1;
      }
      if (chunk <= 0) throw UsageError(cat("--mode: chunk size must be a positive integer, got '", mode, "'"));
    } else {
      throw UsageError(cat("--mode: expected prefill, decode or chunked:N, got '", mode, "'"));
    }
    KvFormat fmt = a.has("--cache") ? kv_format_from_string(*a.get("--cache")) : default_cache_format(backend_name);

    auto j = read_json_file(*a.get("--ids-json"));
    EXL_CHECK(j.is_object() && j.contains("input_ids") && j["input_ids"].is_array(), "runtime: logits: '",
              *a.get("--ids-json"), "' must hold {\"input_ids\": [...]}");
    std::vector<int32_t> ids;
    for (const auto& x : j["input_ids"]) {
      EXL_CHECK(x.is_number_integer(), "runtime: logits: input_ids must be integers, got ", x.dump());
      ids.push_back(x.get<int32_t>());
    }
    EXL_CHECK(!ids.empty(), "runtime: logits: input_ids is empty");

    ModelDir dir(*a.get("--model"));
    const int threads = int(a.get_int("--threads", 0));
    const std::string split = gpu_split_flag(a, backend_name);
    const int tp = tensor_parallel_flag(a);
    const int page_size = 64;
    const int pages = int((ids.size() + page_size - 1) / page_size);
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<Backend*> raw;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Model> model_ptr;
    if (tp > 1) {
      GpuSplit ranks;
      ranks.n_devices = tp;
      backends = make_split_backends(backend_name, ranks, threads, "--tensor-parallel");
      for (const auto& b : backends) raw.push_back(b.get());
      std::vector<int> devices;
      for (int d = 0; d < tp; ++d) devices.push_back(d);
      comm = backend_name == "cuda" && nccl_available() ? make_nccl_communicator(raw, devices)
                                                        : make_host_communicator(raw);
      model_ptr = std::make_unique<Model>(dir, raw, *comm);
    } else if (!split.empty()) {
      const GpuSplit gs = parse_gpu_split(split, backend_name);
      backends = make_split_backends(backend_name, gs, threads);
      MemoryRequest req;
      req.cache_format = fmt;
      req.page_size = page_size;
      req.cache_pages = pages;
      req.max_batch_seqs = 1;
      req.max_step_tokens = int(chunk == 0 ? int64_t(ids.size()) : chunk);
      req.max_seq_len = int64_t(ids.size());
      const LayerPlacement placement = plan_layer_split(dir, req, gs, device_memories(backends));
      check_fits(placement);
      std::vector<ModelPart> parts;
      for (const auto& [device, range] : placement.used_ranges())
        parts.push_back({backends[size_t(device)].get(), range.first, range.second});
      model_ptr = std::make_unique<Model>(dir, parts);
    } else {
      backends.push_back(make_backend(backend_name, threads));
      model_ptr = std::make_unique<Model>(dir, *backends.front());
    }
    Model& model = *model_ptr;
    auto pool = model.alloc_kv_pool(fmt, page_size, pages);
    std::vector<int32_t> table(static_cast<size_t>(pages));
    for (int i = 0; i < pages; ++i) table[size_t(i)] = i;
    if (chunk == 0) chunk = int64_t(ids.size());

    std::ofstream out(*a.get("--out"), std::ios::binary | std::ios::trunc);
    EXL_CHECK(out.good(), "runtime: logits: cannot write '", *a.get("--out"), "'");
    for (size_t b = 0; b < ids.size(); b += size_t(chunk)) {
      const size_t e = std::min(ids.size(), b + size_t(chunk));
      ForwardSeq s{std::span<const int32_t>(ids).subspan(b, e - b), int64_t(b), table, true};
      auto logits = model.forward(std::span<const ForwardSeq>(&s, 1), *pool);
      out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
    }
    out.close();
    EXL_CHECK(out.good(), "runtime: logits: error writing '", *a.get("--out"), "'");
    return 0;
  });
}

}  // namespace exl
