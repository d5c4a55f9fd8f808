#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>

#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "engine/memory_plan.h"
#include "engine/model.h"
#include "engine/formats/model_dir.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cuda_backend.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/model_host.h"

namespace exl {

namespace {

using Clock = std::chrono::steady_clock;

const CommandSpec& bench_spec() {
  static const CommandSpec s{
      "bench",
      "Measure prefill tokens/s, decode tokens/s at several batch sizes and the prefix-cache speed-up\n"
      "(time to first token of a prompt whose prefix is cached vs cold: the prefix is run once, then\n"
      "the prefix plus a new suffix, as an agent turn appends a tool result). Prompts are seeded random\n"
      "token ids. On cuda, \"% of roofline\" is the bytes a decode step must read (weights except the\n"
      "embedding table, plus the used KV cache) per step time, over the measured device-to-device copy\n"
      "bandwidth (summed over the devices of a --gpu-split or --tensor-parallel). A decode step is what generation runs: the forward pass, then greedy sampling (or --temperature's) on\n"
      "the device where the backend can (only the token ids come back), else all logits to the host;\n"
      "where the backend can, decoding is pipelined as Model::forward_device_fed allows: each step is\n"
      "queued, reading the previous step's sampled tokens on the device, before the host collects them.\n"
      "Prints a table, or one JSON object with --json.",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--gpu-split", "GB,GB...|auto", k_gpu_split_help},
       {"--tensor-parallel", "N", k_tensor_parallel_help},
       {"--cache", "FORMAT", "KV cache format (default: f32 on cpu, fp16 on cuda)"},
       {"--threads", "N", "CPU threads (default: all)"},
       {"--prefill", "LIST", "prompt lengths for prefill, comma-separated (default 512)"},
       {"--batch", "LIST", "decode batch sizes (default 1,8)"},
       {"--context", "LIST", "decode context lengths (default 128)"},
       {"--decode-steps", "N", "decode steps per measurement (default 32)"},
       {"--repeat", "N", "repetitions; the best is reported (default 3)"},
       {"--no-pipeline", "", "decode steps wait for their tokens before the next step is queued"},
       {"--temperature", "T", "decode: sample at temperature T (default 0: greedy)"},
       {"--top-k", "K", "decode: keep the K most likely tokens (with --temperature; default 0: all)"},
       {"--top-p", "P", "decode: keep the smallest set of mass P (with --temperature; default 1: all)"},
       {"--jobs", "N", "generation case: N concurrent jobs through the generator (continuous batching; 0 = skip, default)"},
       {"--job-tokens", "N", "generation case: tokens per job (default 64)"},
       {"--schema", "FILE", "generation case: also run the jobs under this JSON Schema's grammar"},
       {"--prefix-len", "N", "prefix-cache case: tokens of the cached prefix (default 192); one cold run, then --repeat warm runs with new suffixes (best and median)"},
       {"--suffix-len", "N", "prefix-cache case: new tokens after the cached prefix (default 64)"},
       {"--json", "", "print one JSON object"}}};
  return s;
}

std::vector<int64_t> parse_list(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long x = std::stoll(item, &used);
      if (used != item.size() || x <= 0) throw std::invalid_argument("");
      out.push_back(x);
    } catch (const std::exception&) {
      throw UsageError(cat(flag, ": expected positive integers separated by commas, got '", v, "'"));
    }
  }
  if (out.empty()) throw UsageError(cat(flag, ": empty list"));
  return out;
}

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int cli_bench(std::span<const std::string> args) {
  if (!args.empty() && args[0] == "grammar") return cli_bench_grammar(args.subspan(1));
  return run_command(bench_spec(), args, [](const ParsedArgs& a) {
    const std::string backend_name = a.get_or("--backend", "cpu");
    const auto prefill = parse_list("--prefill", a.get_or("--prefill", "512"));
    const auto batches = parse_list("--batch", a.get_or("--batch", "1,8"));
    const auto contexts = parse_list("--context", a.get_or("--context", "128"));
    const int64_t steps = a.get_int("--decode-steps", 32), repeat = a.get_int("--repeat", 3);
    if (steps <= 0 || repeat <= 0) throw UsageError("--decode-steps and --repeat must be positive");
    RowSampling decode_sampling;
    decode_sampling.temperature = float(a.get_double("--temperature", 0.0));
    decode_sampling.top_k = int32_t(a.get_int("--top-k", 0));
    decode_sampling.top_p = float(a.get_double("--top-p", 1.0));
    decode_sampling.u = 0.5;
    if (!(decode_sampling.temperature >= 0.0f) || decode_sampling.top_k < 0 ||
        !(decode_sampling.top_p > 0.0f && decode_sampling.top_p <= 1.0f))
      throw UsageError("--temperature must be >= 0, --top-k >= 0 and --top-p in (0, 1]");
    const int64_t prefix_len = a.get_int("--prefix-len", 192), suffix_len = a.get_int("--suffix-len", 64);
    const int64_t n_jobs = a.get_int("--jobs", 0), job_tokens = a.get_int("--job-tokens", 64);
    if (n_jobs < 0 || job_tokens <= 0) throw UsageError("--jobs must be >= 0 and --job-tokens positive");
    if (prefix_len < 0 || suffix_len <= 0) throw UsageError("--prefix-len must be >= 0 and --suffix-len positive");

    ModelHost host(model_host_options(a));
    const KvFormat fmt = host.cache_format();
    const ModelDir& dir = host.dir();
    Backend* backend = &host.backend();
    auto sync_all = [&] {
      for (const auto& b : host.backends()) b->synchronize();
    };
    const int page = 64;
    const int64_t max_pos = dir.config().max_position_embeddings;
    // The largest of the pools and steps below.
    const int prefix_pages = int(2 * ((std::min(prefix_len + suffix_len, max_pos) + page - 1) / page) + 4);
    MemoryRequest req{fmt, page, prefix_pages, 1, int(std::min(prefix_len + suffix_len, max_pos)),
                      std::min(prefix_len + suffix_len, max_pos)};
    for (int64_t n : prefill) {
      n = std::min(n, max_pos);
      req.cache_pages = std::max(req.cache_pages, int((n + page - 1) / page));
      req.max_step_tokens = std::max(req.max_step_tokens, int(n));
      req.max_seq_len = std::max(req.max_seq_len, n);
    }
    for (int64_t ctx : contexts)
      for (int64_t b : batches) {
        ctx = std::min(ctx, max_pos - steps);
        req.cache_pages = std::max(req.cache_pages, int((ctx + steps + page - 1) / page * b));
        req.max_step_tokens = std::max(req.max_step_tokens, int(std::max(ctx, b)));
        req.max_batch_seqs = std::max(req.max_batch_seqs, int(b));
        req.max_seq_len = std::max(req.max_seq_len, ctx + steps);
      }
    host.load(req);
    Model& model = host.model();
    const int64_t V = model.vocab_size();
    std::mt19937 rng(1234);
    auto random_ids = [&](int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = int32_t(rng() % uint32_t(V));
      return v;
    };
    // Bytes every decode step must read: all weights except the embedding table (one row per token),
    // unless the head is the tied embedding.
    uint64_t step_weight_bytes = 0;
    for (const auto& name : dir.tensor_names())
      if (name != "model.embed_tokens.weight" || !(dir.has("lm_head.weight") || dir.has("lm_head.q_weight")))
        step_weight_bytes += dir.find(name)->info->nbytes;
    const double kv_bytes_per_token = model.kv_layout(fmt, page).bytes_per_token();
    // Roofline: the measured device copy bandwidth (bytes read + written per second) on CUDA.
    double copy_bw = 0.0;
    if (backend_name == "cuda")
      for (size_t d = 0; d < host.backends().size(); ++d) copy_bw += cuda_copy_bandwidth(int(d));
    nlohmann::json out = {{"model", dir.path().string()},
                          {"backend", backend->name()},
                          {"cache", to_string(fmt)},
                          {"weight_bytes_per_step", step_weight_bytes}};
    if (copy_bw > 0) out["copy_bandwidth_gb_per_s"] = copy_bw / 1e9;

    for (int64_t n : prefill) {
      n = std::min(n, max_pos);
      auto ids = random_ids(n);
      int pages = int((n + page - 1) / page);
      auto pool = model.alloc_kv_pool(fmt, page, pages);
      std::vector<int32_t> table(static_cast<size_t>(pages));
      for (int i = 0; i < pages; ++i) table[size_t(i)] = i;
      double best = 1e30;
      for (int64_t r = 0; r < repeat; ++r) {
        ForwardSeq s{ids, 0, table, false};
        auto t0 = Clock::now();
        model.forward(std::span<const ForwardSeq>(&s, 1), *pool);
        sync_all();
        best = std::min(best, secs(t0, Clock::now()));
      }
      out["prefill"].push_back({{"tokens", n}, {"seconds", best}, {"tokens_per_s", double(n) / best}});
    }

    for (int64_t ctx : contexts) {
      ctx = std::min(ctx, max_pos - steps);
      for (int64_t b : batches) {
        const int pages_per_seq = int((ctx + steps + page - 1) / page);
        auto pool = model.alloc_kv_pool(fmt, page, pages_per_seq * int(b));
        std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b)), seqs(static_cast<size_t>(b));
        for (int64_t s = 0; s < b; ++s) {
          for (int i = 0; i < pages_per_seq; ++i) tables[size_t(s)].push_back(int32_t(s * pages_per_seq + i));
          seqs[size_t(s)] = random_ids(ctx + steps);
          ForwardSeq f{std::span<const int32_t>(seqs[size_t(s)]).first(size_t(ctx)), 0, tables[size_t(s)], false};
          model.forward(std::span<const ForwardSeq>(&f, 1), *pool);
        }
        const bool on_device = model.can_sample_on_device();
        bool pipelined = on_device && !a.has("--no-pipeline");
        std::vector<RowSampling> row_sampling(static_cast<size_t>(b), decode_sampling);
        for (int64_t s = 0; s < b; ++s) row_sampling[size_t(s)].row = s;
        std::vector<int32_t> sampled(static_cast<size_t>(b));
        double best = 1e30;
        for (int64_t r = 0; r < repeat; ++r) {
          auto t0 = Clock::now();
          for (int64_t st = 0; st < steps; ++st) {
            std::vector<ForwardSeq> batch;
            for (int64_t s = 0; s < b; ++s)
              batch.push_back({std::span<const int32_t>(seqs[size_t(s)]).subspan(size_t(ctx + st), 1), ctx + st,
                               tables[size_t(s)], false});
            if (pipelined) {  // step st reads step st-1's tokens on the device; the host reads them after
              if (st == 0) model.forward_device(batch, *pool);
              else model.forward_device_fed(batch, *pool), model.collect_samples(sampled);
              pipelined = model.sample_device_deferred(row_sampling);
              if (!pipelined) EXL_CHECK(model.sample_device(row_sampling, sampled), "bench: the backend cannot sample on the device");
              if (st + 1 == steps && pipelined) model.collect_samples(sampled);
            } else if (on_device) {
              model.forward_device(batch, *pool);
              EXL_CHECK(model.sample_device(row_sampling, sampled), "bench: the backend cannot sample on the device");
            } else {
              model.forward(batch, *pool);
            }
          }
          sync_all();
          best = std::min(best, secs(t0, Clock::now()));
        }
        const double step_s = best / double(steps);
        const double bytes = double(step_weight_bytes) + double(b) * double(ctx + steps / 2) * kv_bytes_per_token;
        out["decode"].push_back({{"batch", b},
                                 {"context", ctx},
                                 {"sampled_on_device", on_device},
                                 {"pipelined", pipelined},
                                 {"temperature", decode_sampling.temperature},
                                 {"top_k", decode_sampling.top_k},
                                 {"top_p", decode_sampling.top_p},
                                 {"step_ms", step_s * 1e3},
                                 {"tokens_per_s", double(b * steps) / best},
                                 {"bytes_per_step", bytes},
                                 {"effective_gb_per_s", bytes / step_s / 1e9}});
        if (copy_bw > 0) out["decode"].back()["roofline_pct"] = 100.0 * bytes / step_s / copy_bw;
      }
    }

    {  // prefix cache: prefix + a suffix cold, then `repeat` times the prefix + a new suffix, reusing the
       // prefix's full pages
      const int64_t n_prefix = std::min(prefix_len, max_pos - 2 - suffix_len);
      GeneratorOptions go;
      go.page_size = page;
      go.num_pages = int(2 * ((n_prefix + suffix_len + page - 1) / page) + 4);
      auto gen_ptr = host.make_generator(go);
      Generator& gen = *gen_ptr;
      const auto prefix = random_ids(n_prefix);
      const int64_t n = n_prefix + suffix_len;
      std::vector<double> ttft;
      std::string failed;
      int64_t warm_cached = std::numeric_limits<int64_t>::max();
      for (int64_t i = 0; i <= repeat; ++i) {
        GenerationJob job;
        job.prompt = prefix;
        const auto suffix = random_ids(suffix_len);
        job.prompt.insert(job.prompt.end(), suffix.begin(), suffix.end());
        job.sampling.temperature = 0;
        job.max_new_tokens = 1;
        job.on_event = [&, i](const GenerationEvent& e) {
          if (e.type != GenerationEvent::Type::done) return;
          if (e.reason == FinishReason::error) failed = e.error;
          ttft.push_back(e.stats.ttft_s);
          if (i > 0) warm_cached = std::min(warm_cached, e.stats.n_cached_tokens);
        };
        gen.submit(std::move(job));
        gen.run_until_idle();
      }
      if (!failed.empty()) throw std::runtime_error(cat("bench: a prefix-cache job failed: ", failed));
      if (int64_t(ttft.size()) != repeat + 1) throw std::runtime_error("bench: a prefix-cache job did not finish");
      std::vector<double> warm(ttft.begin() + 1, ttft.end());
      std::sort(warm.begin(), warm.end());
      const double best = warm.front(), median = warm[warm.size() / 2];
      out["prefix_cache"] = {{"prompt_tokens", n},
                             {"prefix_tokens", n_prefix},
                             {"cold_ttft_s", ttft[0]},
                             {"warm_runs", repeat},
                             {"warm_ttft_s", best},
                             {"warm_ttft_median_s", median},
                             {"warm_cached_tokens", warm_cached},
                             {"speedup", best > 0 ? ttft[0] / best : 0.0}};
    }

    if (n_jobs > 0) {  // generation: n_jobs concurrent jobs, unconstrained and (with --schema) constrained
      const Tokenizer* tok = &host.tokenizer();
      std::shared_ptr<const CompiledGrammar> grammar;
      if (a.has("--schema")) grammar = compile_json_schema_for(read_schema_file(*a.get("--schema"), "bench"), *tok);
      const int64_t ctx = std::min(contexts.front(), max_pos - job_tokens - 1);
      std::vector<std::vector<int32_t>> prompts;
      for (int64_t j = 0; j < n_jobs; ++j) prompts.push_back(random_ids(ctx));
      GeneratorOptions go;
      go.page_size = page;
      go.max_batch_seqs = int(n_jobs);
      go.num_pages = int(n_jobs * ((ctx + job_tokens + page - 1) / page + 1));
      go.max_step_tokens = int(std::max<int64_t>(n_jobs, 512));
      for (int constrained = 0; constrained < (grammar ? 2 : 1); ++constrained) {
        auto gen_ptr = host.make_generator(go);
        Generator& gen = *gen_ptr;
        int64_t generated = 0;
        const auto t0 = Clock::now();
        for (int64_t j = 0; j < n_jobs; ++j) {
          GenerationJob job;
          job.prompt = prompts[size_t(j)];
          job.sampling.temperature = 0;
          job.max_new_tokens = int32_t(job_tokens);
          if (constrained) job.mask = make_grammar_constraint(grammar, *tok);
          job.on_event = [&](const GenerationEvent& e) {
            if (e.type == GenerationEvent::Type::done) generated += e.stats.n_generated;
          };
          gen.submit(std::move(job));
        }
        gen.run_until_idle();
        const double s_total = secs(t0, Clock::now());
        out["generation"].push_back({{"jobs", n_jobs},
                                     {"prompt_tokens", ctx},
                                     {"grammar", bool(constrained)},
                                     {"tokens", generated},
                                     {"seconds", s_total},
                                     {"tokens_per_s", double(generated) / s_total}});
      }
    }

    if (a.has("--json")) {
      std::cout << out.dump() << "\n";
      return 0;
    }
    std::cout << "model    " << dir.path().string() << "\nbackend  " << backend->name() << "\ncache    "
              << to_string(fmt) << "\n";
    if (copy_bw > 0) std::cout << "copy     " << copy_bw / 1e9 << " GB/s device-to-device (read + write)\n";
    for (const auto& p : out["prefill"])
      std::cout << "prefill  " << p["tokens"] << " tokens: " << p["tokens_per_s"].get<double>() << " tok/s\n";
    for (const auto& d : out["decode"])
      std::cout << "decode   batch " << d["batch"] << " ctx " << d["context"] << ": "
                << d["tokens_per_s"].get<double>() << " tok/s (" << d["step_ms"].get<double>() << " ms/step, "
                << d["effective_gb_per_s"].get<double>() << " GB/s read"
                << (d.contains("roofline_pct") ? cat(", ", d["roofline_pct"].get<double>(), "% of roofline") : std::string())
                << ")\n";
    for (const auto& g : out["generation"])
      std::cout << "generate " << g["jobs"] << " jobs" << (g["grammar"].get<bool>() ? " with the schema's grammar" : "")
                << ": " << g["tokens"] << " tokens, " << g["tokens_per_s"].get<double>() << " tok/s\n";
    const auto& pc = out["prefix_cache"];
    std::cout << "prefix   " << pc["prompt_tokens"] << "-token prompt, " << pc["warm_cached_tokens"]
              << " cached: TTFT " << pc["cold_ttft_s"].get<double>() * 1e3 << " ms cold, "
              << pc["warm_ttft_s"].get<double>() * 1e3 << " ms warm (best of " << pc["warm_runs"] << ", median "
              << pc["warm_ttft_median_s"].get<double>() * 1e3 << " ms), speed-up x" << pc["speedup"].get<double>() << "\n";
    return 0;
  });
}

}  // namespace exl
