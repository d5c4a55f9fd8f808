#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "engine/generator.h"
#include "engine/model.h"
#include "engine/model_dir.h"
#include "engine/tokenizer.h"
#include "runtime/backend_select.h"
#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"

namespace exl {

namespace {

const CommandSpec& spec() {
  static const CommandSpec s{
      "generate",
      "Generate text from a prompt and stream it to stdout (BOS is added as the model's tokenizer\n"
      "config says). Statistics go to stderr with --stats. Without --prompt, generation starts\n"
      "from BOS alone.",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--prompt", "TEXT", "prompt text (default: empty)"},
       {"--max-tokens", "N", "tokens to generate (default 256)"},
       {"--temperature", "T", "sampling temperature, 0 = greedy (default 1.0)"},
       {"--top-p", "P", "nucleus sampling mass (default 1.0 = off)"},
       {"--top-k", "K", "keep the K most likely tokens (default 0 = off)"},
       {"--min-p", "P", "drop tokens below P x the top probability (default 0 = off)"},
       {"--typical-p", "P", "locally typical sampling mass (default 1.0 = off)"},
       {"--repetition-penalty", "R", "CTRL repetition penalty (default 1.0 = off)"},
       {"--seed", "S", "RNG seed (default: random)"},
       {"--sampler", "MODE", "default or llama2c (reproduces llama2.c's run.c sampler exactly)"},
       {"--cache", "FORMAT", "KV cache format: f32 (cpu default), fp16 (cuda default), q8, q4"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--threads", "N", "CPU threads (default: all)"},
       {"--stats", "", "print prompt/cached/generated token counts, TTFT and tokens/s to stderr"}}};
  return s;
}

}  // namespace

int cli_generate(std::span<const std::string> args) {
  return run_command(spec(), args, [](const ParsedArgs& a) {
    SamplerSettings ss;
    ss.temperature = float(a.get_double("--temperature", 1.0));
    ss.top_p = float(a.get_double("--top-p", 1.0));
    ss.top_k = int32_t(a.get_int("--top-k", 0));
    ss.min_p = float(a.get_double("--min-p", 0.0));
    ss.typical_p = float(a.get_double("--typical-p", 1.0));
    ss.repetition_penalty = float(a.get_double("--repetition-penalty", 1.0));
    if (a.has("--seed")) ss.seed = uint64_t(a.get_int("--seed", 0));
    ss.mode = parse_sampler_mode(a.get_or("--sampler", "default"));
    validate(ss);
    const long long max_tokens = a.get_int("--max-tokens", 256);
    if (max_tokens <= 0) throw UsageError("--max-tokens must be positive");
    const std::string backend_name = a.get_or("--backend", "cpu");

    ModelDir dir(*a.get("--model"));
    auto tok = load_tokenizer(dir.path());
    auto backend = make_backend(backend_name, int(a.get_int("--threads", 0)));
    Model model(dir, *backend);

    GenerationJob job;
    job.prompt = tok->encode(a.get_or("--prompt", ""), true);
    if (job.prompt.empty()) {
      EXL_CHECK(tok->bos_id().has_value(), "runtime: generate: empty prompt and the tokenizer has no BOS token");
      job.prompt.push_back(*tok->bos_id());
    }
    job.sampling = ss;
    job.max_new_tokens = int32_t(max_tokens);
    job.stop_tokens.assign(tok->eos_ids().begin(), tok->eos_ids().end());
    if (ss.mode == SamplerMode::llama2c && tok->bos_id()) job.stop_tokens.push_back(*tok->bos_id());

    GeneratorOptions go;
    go.cache_format = a.has("--cache") ? kv_format_from_string(*a.get("--cache")) : default_cache_format(backend_name);
    go.page_size = 64;
    go.num_pages = int((job.prompt.size() + size_t(max_tokens) + 63) / 64 + 1);
    go.max_step_tokens = 512;
    Generator gen(model, *tok, go);
    std::string error;
    GenerationStats stats;
    FinishReason reason = FinishReason::max_tokens;
    job.on_event = [&](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        std::fflush(stdout);
      } else {
        stats = e.stats;
        reason = e.reason;
        error = e.error;
      }
    };
    gen.submit(std::move(job));
    gen.run_until_idle();
    if (isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
    std::fflush(stdout);
    if (reason == FinishReason::error) fail(error);
    if (a.has("--stats"))
      std::cerr << "prompt_tokens=" << stats.n_prompt_tokens << " cached_tokens=" << stats.n_cached_tokens
                << " generated=" << stats.n_generated << " ttft_s=" << stats.ttft_s
                << " tokens_per_s=" << stats.tokens_per_s() << " finish=" << to_string(reason) << "\n";
    return 0;
  });
}

}  // namespace exl
