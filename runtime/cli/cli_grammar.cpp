#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

namespace {

using Clock = std::chrono::steady_clock;

// Microseconds on the wall clock or, with cpu, on this thread's CPU clock (which leaves out time
// the thread waited for a core: fairer on a loaded machine, at ~0.2 us per reading).
double now_us(bool cpu) {
  if (!cpu) return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in.good(), "runtime: grammar: cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tokenizer's vocabulary for the grammar layer: special tokens other than EOS get empty
// bytes, so no grammar ever allows them.
std::shared_ptr<const TokenIndex> token_index(const Tokenizer& tok) {
  std::vector<std::string> bytes(size_t(tok.vocab_size()));
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    if (!tok.is_special(i)) bytes[size_t(i)] = tok.token_bytes(i);
  std::vector<int32_t> eos(tok.eos_ids().begin(), tok.eos_ids().end());
  return std::make_shared<TokenIndex>(std::move(bytes), std::move(eos));
}

JsonSchemaOptions schema_options(const ParsedArgs& a) {
  JsonSchemaOptions o;
  std::string order = a.get_or("--property-order", "schema");
  o.integer_zero_fraction = true;
  if (order == "any") o.property_order = JsonSchemaOptions::PropertyOrder::any;
  else if (order != "schema") throw UsageError("--property-order: expected 'schema' or 'any'");
  std::string ws = a.get_or("--whitespace", "compact");
  if (ws == "flexible") o.whitespace = JsonSchemaOptions::Whitespace::flexible;
  else if (ws == "spaced") o.whitespace = JsonSchemaOptions::Whitespace::spaced;
  else if (ws != "compact") throw UsageError("--whitespace: expected 'compact', 'spaced' or 'flexible'");
  if (auto v = a.values.find("--ignore-keyword"); v != a.values.end()) o.ignore_keywords = v->second;
  o.ignore_unknown_keywords = a.has("--ignore-unknown-keywords");
  return o;
}

int check(std::span<const std::string> args) {
  static const CommandSpec spec{
      "grammar check",
      "Compile a JSON Schema or regex for the tokenizer of DIR and feed a text to it token by token.\n"
      "Exit 0 when the whole text is accepted (and EOS is then allowed), 1 when rejected, 2 when the\n"
      "grammar does not compile (message on stderr).",
      {},
      {{"--tokenizer", "DIR", "model or tokenizer directory", true},
       {"--json-schema", "FILE", "JSON Schema file"},
       {"--regex", "R", "full-match regular expression"},
       {"--instance", "FILE", "the text to check"},
       {"--text", "T", "the text to check"},
       {"--property-order", "ORDER", "schema (default) or any"},
       {"--whitespace", "WS", "compact (default), spaced (\", \" and \": \") or flexible"},
       {"--ignore-keyword", "KW", "lenient mode: ignore this schema keyword (repeatable)", false, true},
       {"--ignore-unknown-keywords", "", "lenient mode: treat keywords of no JSON Schema draft as annotations"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    if (a.has("--json-schema") == a.has("--regex")) throw UsageError("exactly one of --json-schema and --regex is required");
    if (a.has("--instance") == a.has("--text")) throw UsageError("exactly one of --instance and --text is required");
    JsonSchemaOptions opts = schema_options(a);
    std::string text = a.has("--text") ? *a.get("--text") : read_text(*a.get("--instance"));
    auto tok = load_tokenizer(*a.get("--tokenizer"));
    std::shared_ptr<CompiledGrammar> g;
    try {
      Grammar gr = a.has("--regex") ? compile_regex_grammar(*a.get("--regex"))
                                    : compile_json_schema_text(read_text(*a.get("--json-schema")), opts);
      g = std::make_shared<CompiledGrammar>(std::move(gr), token_index(*tok));
    } catch (const GrammarError& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
    Matcher m(g);
    std::vector<int32_t> ids = tok->encode(text, false);
    for (size_t i = 0; i < ids.size(); ++i)
      if (!m.accept(ids[i])) {
        std::cout << "rejected at token " << i << " (id " << ids[i] << ", bytes "
                  << nlohmann::json(tok->token_bytes(ids[i])).dump() << ")\n";
        return 1;
      }
    if (!m.is_accepting()) {
      std::cout << "rejected: the text is incomplete\n";
      return 1;
    }
    std::cout << "accepted (" << ids.size() << " tokens)\n";
    return 0;
  });
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, size_t(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

struct SplitCounts {
  int64_t schemas = 0, compiled = 0, compile_errors = 0, passing = 0;
  int64_t valid_total = 0, valid_accepted = 0, invalid_total = 0, invalid_rejected = 0, invalid_accepted = 0;
  std::vector<double> mask_us, compile_ms;
  nlohmann::ordered_json to_json() const {
    std::vector<double> mu = mask_us, cm = compile_ms;
    return {{"schemas", schemas}, {"compiled", compiled}, {"compile_errors", compile_errors}, {"passing", passing},
            {"valid_total", valid_total}, {"valid_accepted", valid_accepted}, {"invalid_total", invalid_total},
            {"invalid_rejected", invalid_rejected}, {"invalid_accepted", invalid_accepted},
            {"masks", mask_us.size()}, {"mask_us_p50", percentile(mu, 0.5)}, {"mask_us_p99", percentile(mu, 0.99)},
            {"mask_us_max", mu.empty() ? 0.0 : *std::max_element(mu.begin(), mu.end())},
            {"compile_ms_p50", percentile(cm, 0.5)}, {"compile_ms_p99", percentile(cm, 0.99)},
            {"compile_ms_max", cm.empty() ? 0.0 : *std::max_element(cm.begin(), cm.end())}};
  }
};

int run_maskbench(const ParsedArgs& a, const std::vector<std::string>& files);

int maskbench(std::span<const std::string> args) {
  static const CommandSpec spec{
      "grammar maskbench",
      "Run MaskBench-format files ({schema, tests:[{data, valid}]}): compile each schema (property order\n"
      "any), feed each test's compact serialization token by token, timing every mask. Prints one JSON object:\n"
      "totals, per-split counts and mask/compile p50/p99/max, and the 10 slowest files (\"slowest\").\n"
      "Keywords of no JSON Schema draft (\"self\", \"javaType\", ...) are ignored as annotations unless\n"
      "--strict-keywords; unsupported validation keywords are compile errors either way.",
      {"FILE..."},
      {{"--tokenizer", "DIR", "model or tokenizer directory", true},
       {"--whitespace", "WS", "compact (default), spaced (\", \" and \": \") or flexible"},
       {"--ignore-keyword", "KW", "lenient mode: ignore this schema keyword (repeatable)", false, true},
       {"--strict-keywords", "", "unknown keywords are compile errors"},
       {"--clock", "CLOCK", "wall (default) or cpu: time masks and compiles on this thread's CPU clock"},
       {"--errors", "", "list compile errors and misclassified tests on stderr"},
       {"--per-file", "", "one line per file on stderr: compile ms, masks, mask p50/max/sum us"}},
      1};
  return run_command(spec, args, [](const ParsedArgs& a) { return run_maskbench(a, a.positionals); });
}

int run_maskbench(const ParsedArgs& a, const std::vector<std::string>& files) {
  JsonSchemaOptions opts = schema_options(a);
  opts.property_order = JsonSchemaOptions::PropertyOrder::any;
  opts.integer_zero_fraction = true;
  opts.ignore_unknown_keywords = !a.has("--strict-keywords");
  bool show_errors = a.has("--errors");
  bool per_file = a.has("--per-file");
  std::string clock = a.get_or("--clock", "wall");
  if (clock != "wall" && clock != "cpu") throw UsageError("--clock: expected 'wall' or 'cpu'");
  bool cpu_clock = clock == "cpu";
  auto tok = load_tokenizer(*a.get("--tokenizer"));
  auto index = token_index(*tok);
  std::vector<double> mask_us, compile_ms;
  std::map<std::string, SplitCounts> splits;
  SplitCounts total;
  std::vector<uint32_t> mask(index->mask_words());
  // per file: compile ms, masks' sum ms, largest mask us (the slowest files, by compile + masks)
  struct FileTime {
    std::string name;
    double compile_ms, mask_ms, max_mask_us;
  };
  std::vector<FileTime> file_times;
  for (const std::string& path : files) {
    std::string name = std::filesystem::path(path).filename().string();
    std::string split = name.substr(0, name.find("---"));
    SplitCounts& sc = splits[split];
    auto doc = nlohmann::ordered_json::parse(read_text(path));
    ++sc.schemas, ++total.schemas;
    std::shared_ptr<CompiledGrammar> g;
    double t0 = now_us(cpu_clock);
    try {
      g = std::make_shared<CompiledGrammar>(compile_json_schema(doc.at("schema"), opts), index);
    } catch (const GrammarError& e) {
      if (show_errors) std::cerr << name << ": " << e.what() << "\n";
    }
    compile_ms.push_back((now_us(cpu_clock) - t0) * 1e-3);
    sc.compile_ms.push_back(compile_ms.back());
    size_t first_mask = mask_us.size();
    bool all_right = g != nullptr;
    if (g) ++sc.compiled, ++total.compiled;
    else ++sc.compile_errors, ++total.compile_errors;
    for (const auto& t : doc.at("tests")) {
      bool valid = t.at("valid").get<bool>();
      (valid ? sc.valid_total : sc.invalid_total)++;
      (valid ? total.valid_total : total.invalid_total)++;
      if (!g) continue;
      Matcher m(g);
      std::vector<int32_t> ids = tok->encode(t.at("data").dump(), false);
      bool ok = true;
      for (size_t i = 0; i <= ids.size() && ok; ++i) {
        std::fill(mask.begin(), mask.end(), 0);
        double m0 = now_us(cpu_clock);
        m.fill_mask(mask);
        mask_us.push_back(now_us(cpu_clock) - m0);
        sc.mask_us.push_back(mask_us.back());
        if (show_errors && mask_us.back() > 1000) std::cerr << name << ": slow mask " << mask_us.back() << " us at token " << i << "\n";
        if (i == ids.size()) {
          ok = std::any_of(index->eos_ids().begin(), index->eos_ids().end(),
                           [&](int32_t e) { return mask[size_t(e) / 32] >> (e % 32) & 1; });
        } else {
          ok = mask[size_t(ids[i]) / 32] >> (ids[i] % 32) & 1;
          if (ok && !m.accept(ids[i])) throw GrammarError("grammar: maskbench: mask allows a token accept refuses");
        }
      }
      if (ok == valid) {
        (valid ? sc.valid_accepted : sc.invalid_rejected)++;
        (valid ? total.valid_accepted : total.invalid_rejected)++;
      } else {
        all_right = false;
        if (!valid) ++sc.invalid_accepted, ++total.invalid_accepted;
        if (show_errors) std::cerr << name << ": " << (valid ? "rejected valid " : "ACCEPTED INVALID ") << t.at("data").dump().substr(0, 200) << "\n";
      }
    }
    if (all_right) ++sc.passing, ++total.passing;
    {
      double sum = 0, mx = 0;
      for (size_t i = first_mask; i < mask_us.size(); ++i) sum += mask_us[i], mx = std::max(mx, mask_us[i]);
      file_times.push_back({name, compile_ms.back(), sum * 1e-3, mx});
    }
    if (per_file) {
      std::vector<double> fm(mask_us.begin() + std::ptrdiff_t(first_mask), mask_us.end());
      double sum = 0;
      for (double x : fm) sum += x;
      double mx = fm.empty() ? 0.0 : *std::max_element(fm.begin(), fm.end());
      std::fprintf(stderr, "%s compile_ms %.3f masks %zu p50_us %.1f max_us %.0f sum_us %.0f%s\n", name.c_str(),
                   compile_ms.back(), fm.size(), percentile(fm, 0.5), mx, sum, g ? "" : " (error)");
    }
  }
  nlohmann::ordered_json out = {{"files", files.size()}, {"compiled", total.compiled},
                                {"compile_errors", total.compile_errors}, {"passing", total.passing},
                                {"valid_total", total.valid_total}, {"valid_accepted", total.valid_accepted},
                                {"invalid_total", total.invalid_total}, {"invalid_rejected", total.invalid_rejected},
                                {"invalid_accepted", total.invalid_accepted}};
  std::vector<double> mu = mask_us, cm = compile_ms;
  out["masks"] = mask_us.size();
  out["mask_us_p50"] = percentile(mu, 0.5);
  out["mask_us_p99"] = percentile(mu, 0.99);
  out["mask_us_max"] = mask_us.empty() ? 0 : *std::max_element(mask_us.begin(), mask_us.end());
  out["compile_ms_p50"] = percentile(cm, 0.5);
  out["compile_ms_p99"] = percentile(cm, 0.99);
  out["compile_ms_max"] = compile_ms.empty() ? 0 : *std::max_element(compile_ms.begin(), compile_ms.end());
  std::sort(file_times.begin(), file_times.end(),
            [](const FileTime& x, const FileTime& y) { return x.compile_ms + x.mask_ms > y.compile_ms + y.mask_ms; });
  nlohmann::ordered_json slow = nlohmann::ordered_json::array();
  for (size_t i = 0; i < file_times.size() && i < 10; ++i)
    slow.push_back({{"file", file_times[i].name}, {"compile_ms", file_times[i].compile_ms},
                    {"masks_ms", file_times[i].mask_ms}, {"mask_us_max", file_times[i].max_mask_us}});
  out["slowest"] = slow;
  nlohmann::ordered_json sp = nlohmann::ordered_json::object();
  for (const auto& [k, v] : splits) sp[k] = v.to_json();
  out["splits"] = sp;
  std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace

int cli_bench_grammar(std::span<const std::string> args) {
  static const CommandSpec spec{
      "bench grammar",
      "MaskBench over the JSONSchemaBench splits the grammar targets are set for (Glaiveai2K,\n"
      "Github_trivial, Github_easy, Github_medium, Snowplow): every --every'th file of each split, by name.\n"
      "Prints grammar maskbench's JSON object (per-split counts and timings under \"splits\", the 10\n"
      "slowest files by compile plus mask time under \"slowest\").",
      {},
      {{"--tokenizer", "DIR", "model or tokenizer directory (the benchmark uses the Llama 3 tokenizer)", true},
       {"--data", "DIR", "MaskBench data folder (default ../shared/data/jsonschemabench/maskbench/data)"},
       {"--splits", "LIST", "comma-separated split names (default the five above)"},
       {"--every", "N", "take every N-th file of each split (default 1: all)"},
       {"--clock", "CLOCK", "wall (default) or cpu: time masks and compiles on this thread's CPU clock"},
       {"--errors", "", "list compile errors and misclassified tests on stderr"},
       {"--per-file", "", "one line per file on stderr: compile ms, masks, mask p50/max/sum us"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    std::filesystem::path dir = a.get_or("--data", "../shared/data/jsonschemabench/maskbench/data");
    std::string list = a.get_or("--splits", "Glaiveai2K,Github_trivial,Github_easy,Github_medium,Snowplow");
    int64_t every = a.get_int("--every", 1);
    if (every <= 0) throw UsageError("--every must be positive");
    std::vector<std::string> names;
    std::stringstream ss(list);
    for (std::string x; std::getline(ss, x, ',');)
      if (!x.empty()) names.push_back(x);
    EXL_CHECK(std::filesystem::is_directory(dir), "runtime: bench grammar: '", dir.string(), "' is not a directory");
    std::map<std::string, std::vector<std::string>> by_split;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::string name = e.path().filename().string();
      size_t cut = name.find("---");
      if (cut == std::string::npos || e.path().extension() != ".json") continue;
      std::string split = name.substr(0, cut);
      if (std::find(names.begin(), names.end(), split) != names.end()) by_split[split].push_back(e.path().string());
    }
    std::vector<std::string> files;
    for (auto& [split, v] : by_split) {
      std::sort(v.begin(), v.end());
      for (size_t i = 0; i < v.size(); i += size_t(every)) files.push_back(v[i]);
    }
    EXL_CHECK(!files.empty(), "runtime: bench grammar: no MaskBench files of splits '", list, "' in '", dir.string(), "'");
    return run_maskbench(a, files);
  });
}

int cli_grammar(std::span<const std::string> args) {
  if (args.empty() || (args[0] != "check" && args[0] != "maskbench")) {
    std::cerr << "usage: exlagent grammar check ... | exlagent grammar maskbench ... (--help for either)\n";
    return 2;
  }
  return args[0] == "check" ? check(args.subspan(1)) : maskbench(args.subspan(1));
}

}  // namespace exl
