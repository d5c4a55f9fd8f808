#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/job_engine.h"
#include "sessions/extraction_prompt.h"

namespace exl {

namespace {

const CommandSpec& extract_spec() {
  static const CommandSpec s{
      "extract",
      "Extract one JSON object per input document (a file, or - for stdin) under a JSON Schema and\n"
      "print it on one line (JSONL when there are several inputs, in input order). Output is\n"
      "generated under the schema's grammar, so every printed object is valid by construction; an\n"
      "input that fails is reported on stderr and the exit code is 1. All inputs are generated\n"
      "together (continuous batching).",
      {"INPUT..."},
      with_job_engine_flags(
          {{"--model", "DIR", "model directory", true},
           {"--schema", "FILE", "JSON Schema of the object to extract", true},
           {"--instructions", "TEXT", "instructions for the model (default: a generic extraction instruction)"},
           {"--max-tokens", "N", "tokens per object (default: the rest of the context)"},
           {"--temperature", "T", "sampling temperature (default 0 = greedy)"},
           {"--seed", "S", "RNG seed (default: random)"},
           {"--concurrency", "N", "documents generated at once (default 16)"}}),
      1};
  return s;
}

// The document's text without trailing whitespace (files end with a newline; prompts do not).
std::string read_input(const std::string& name) {
  std::string text;
  if (name == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream in(name, std::ios::binary);
    EXL_CHECK(in, "runtime: extract: cannot read input '", name, "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text;
}

}  // namespace

int cli_extract(std::span<const std::string> args) {
  return run_command(extract_spec(), args, [](const ParsedArgs& a) {
    const long long conc = a.get_int("--concurrency", 16);
    if (conc <= 0) throw UsageError("--concurrency must be positive");
    std::optional<int64_t> max_tokens;
    if (a.has("--max-tokens")) {
      max_tokens = a.get_int("--max-tokens", 0);
      if (*max_tokens <= 0) throw UsageError("--max-tokens must be positive");
    }
    SamplerSettings ss;
    ss.temperature = float(a.get_double("--temperature", 0.0));
    if (a.has("--seed")) ss.seed = uint64_t(a.get_int("--seed", 0));
    validate(ss);

    const std::string schema_path = *a.get("--schema");
    const nlohmann::ordered_json schema = read_schema_file(schema_path, "extract");
    std::vector<std::string> docs;
    for (const auto& in : a.positionals) docs.push_back(read_input(in));

    JobEngine engine(
        job_engine_options(a, *a.get("--model"), int(std::min<long long>(conc, std::max<size_t>(docs.size(), 1)))));
    try {
      engine.check_schema(schema);
    } catch (const Error& e) {
      fail("runtime: extract: '", schema_path, "': ", e.what());
    }

    std::vector<JobOutcome> results(docs.size());
    const std::string instructions = a.get_or("--instructions", "");
    for (size_t i = 0; i < docs.size(); ++i) {
      ChatJobSpec js;
      js.messages = extraction_messages(instructions, schema, docs[i]);
      js.schema = schema;
      js.max_tokens = max_tokens;
      js.sampling = ss;
      engine.submit(std::move(js), [&results, i](JobOutcome o) { results[i] = std::move(o); });
    }
    engine.run_until_idle();
    int code = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (results[i].ok) {
        std::cout << results[i].json.dump() << "\n";
      } else {
        std::cerr << "extract: '" << a.positionals[i] << "': " << results[i].error << "\n";
        code = 1;
      }
    }
    std::cout.flush();
    return code;
  });
}

}  // namespace exl
