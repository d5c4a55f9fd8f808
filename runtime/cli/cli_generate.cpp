#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "grammar/grammar_error.h"
#include "engine/tokenizer/tokenizer.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/model_host.h"

namespace exl {

namespace {

const CommandSpec& generate_spec() {
  static const CommandSpec s{
      "generate",
      "Generate text from a prompt and stream it to stdout (BOS is added as the model's tokenizer\n"
      "config says). Statistics go to stderr with --stats. Without --prompt, generation starts\n"
      "from BOS alone. --json-schema / --regex constrain the output to a grammar (the output is then\n"
      "complete when the grammar is, and a schema that cannot be enforced is an error, exit 2).\n"
      "--seeds runs one job per seed in one batch and prints one JSON line per job instead:\n"
      "{\"seed\", \"text\", \"finish_reason\", \"generated\"}.",
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
       {"--seeds", "S,S,...", "one job per seed, batched; JSON-lines output"},
       {"--json-schema", "FILE", "constrain the output to this JSON Schema"},
       {"--regex", "R", "constrain the output to this full-match regular expression"},
       {"--whitespace", "WS", "JSON whitespace: compact (default), spaced (\", \" and \": \", as json.dumps) or flexible"},
       {"--sampler", "MODE", "default or llama2c (reproduces llama2.c's run.c sampler exactly)"},
       {"--cache", "FORMAT", "KV cache format: f32 (cpu default), fp16 (cuda default), q8, q4"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--gpu-split", "GB,GB...|auto", k_gpu_split_help},
       {"--tensor-parallel", "N", k_tensor_parallel_help},
       {"--threads", "N", "CPU threads (default: all)"},
       {"--stats", "", "print prompt/cached/generated token counts, TTFT and tokens/s to stderr"}}};
  return s;
}

struct JobResult {
  std::string text;
  GenerationStats stats;
  FinishReason reason = FinishReason::max_tokens;
  std::string error;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in.good(), "runtime: generate: cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The grammar of --json-schema / --regex, or null. A grammar that does not compile is a usage
// error (exit 2) with the compiler's message.
std::shared_ptr<const CompiledGrammar> output_grammar(const ParsedArgs& a, const Tokenizer& tok) {
  if (a.has("--json-schema") && a.has("--regex")) throw UsageError("--json-schema and --regex exclude each other");
  JsonSchemaOptions opts;
  const std::string ws = a.get_or("--whitespace", "compact");
  if (ws == "flexible") opts.whitespace = JsonSchemaOptions::Whitespace::flexible;
  else if (ws == "spaced") opts.whitespace = JsonSchemaOptions::Whitespace::spaced;
  else if (ws != "compact") throw UsageError("--whitespace: expected 'compact', 'spaced' or 'flexible'");
  try {
    if (a.has("--regex")) return compile_regex_for(*a.get("--regex"), tok);
    if (a.has("--json-schema"))
      return compile_grammar_for(compile_json_schema_text(read_file(*a.get("--json-schema")), opts), tok);
  } catch (const GrammarError& e) {
    throw UsageError(e.what());
  }
  return nullptr;
}

std::vector<uint64_t> seed_list(const ParsedArgs& a) {
  std::vector<uint64_t> out;
  if (!a.has("--seeds")) return out;
  if (a.has("--seed")) throw UsageError("--seed and --seeds exclude each other");
  std::stringstream ss(*a.get("--seeds"));
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoull(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError("--seeds: expected comma-separated non-negative integers, got '" + item + "'");
    }
  }
  if (out.empty() || out.size() > 1024) throw UsageError("--seeds: expected 1 to 1024 seeds");
  return out;
}

}  // namespace

int cli_generate(std::span<const std::string> args) {
  return run_command(generate_spec(), args, [](const ParsedArgs& a) {
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

    ModelHost host(model_host_options(a));
    const Tokenizer* tok = &host.tokenizer();
    std::shared_ptr<const CompiledGrammar> grammar = output_grammar(a, *tok);
    const std::vector<uint64_t> seeds = seed_list(a);

    GenerationJob proto;
    proto.prompt = tok->encode(a.get_or("--prompt", ""), true);
    if (proto.prompt.empty()) {
      EXL_CHECK(tok->bos_id().has_value(), "runtime: generate: empty prompt and the tokenizer has no BOS token");
      proto.prompt.push_back(*tok->bos_id());
    }
    proto.sampling = ss;
    proto.max_new_tokens = int32_t(max_tokens);
    proto.stop_tokens.assign(tok->eos_ids().begin(), tok->eos_ids().end());
    if (ss.mode == SamplerMode::llama2c && tok->bos_id()) proto.stop_tokens.push_back(*tok->bos_id());

    const size_t n_jobs = seeds.empty() ? 1 : seeds.size();
    GeneratorOptions go;
    go.page_size = 64;
    go.num_pages = int(n_jobs * ((proto.prompt.size() + size_t(max_tokens) + 63) / 64 + 1));
    go.max_step_tokens = 512;
    go.max_batch_seqs = int(std::min<size_t>(n_jobs, 64));
    auto gen_ptr = host.load_generator(go, int64_t(proto.prompt.size()) + max_tokens);
    Generator& gen = *gen_ptr;
    std::vector<JobResult> results(n_jobs);
    for (size_t i = 0; i < n_jobs; ++i) {
      GenerationJob job = proto;
      if (!seeds.empty()) job.sampling.seed = seeds[i];
      if (grammar) job.mask = make_grammar_constraint(grammar, *tok);
      JobResult* r = &results[i];
      const bool stream = seeds.empty();
      job.on_event = [r, stream](const GenerationEvent& e) {
        if (e.type == GenerationEvent::Type::token) {
          r->text += e.text;
          if (stream) {
            std::fwrite(e.text.data(), 1, e.text.size(), stdout);
            std::fflush(stdout);
          }
        } else {
          r->stats = e.stats;
          r->reason = e.reason;
          r->error = e.error;
        }
      };
      gen.submit(std::move(job));
    }
    gen.run_until_idle();
    if (seeds.empty()) {
      if (isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
      std::fflush(stdout);
      if (results[0].reason == FinishReason::error) fail(results[0].error);
    } else {
      for (size_t i = 0; i < n_jobs; ++i) {
        nlohmann::json line = {{"seed", seeds[i]},
                               {"text", results[i].text},
                               {"finish_reason", to_string(results[i].reason)},
                               {"generated", results[i].stats.n_generated}};
        if (!results[i].error.empty()) line["error"] = results[i].error;
        std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
      std::cout.flush();
    }
    const GenerationStats& stats = results[0].stats;
    if (a.has("--stats"))
      std::cerr << "prompt_tokens=" << stats.n_prompt_tokens << " cached_tokens=" << stats.n_cached_tokens
                << " generated=" << stats.n_generated << " ttft_s=" << stats.ttft_s
                << " tokens_per_s=" << stats.tokens_per_s() << " finish=" << to_string(results[0].reason) << "\n";
    return 0;
  });
}

}  // namespace exl
