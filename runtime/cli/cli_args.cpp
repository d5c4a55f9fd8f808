#include "runtime/cli/cli_args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace exl {

std::string CommandSpec::usage() const {
  std::string u = "usage: exlagent " + name;
  for (const auto& p : positionals) u += " " + p;
  for (const auto& f : flags) {
    std::string s = f.name + (f.value_name.empty() ? "" : " " + f.value_name);
    u += f.required ? " " + s : " [" + s + "]";
  }
  return u;
}

std::string CommandSpec::help() const {
  std::string h = usage() + "\n\n" + summary + "\n";
  if (!flags.empty()) h += "\noptions:\n";
  for (const auto& f : flags) {
    std::string s = "  " + f.name + (f.value_name.empty() ? "" : " " + f.value_name);
    if (s.size() < 28) s.resize(28, ' ');
    else s += "  ";
    h += s + f.help + "\n";
  }
  h += "  --help                    show this help\n";
  return h;
}

std::optional<std::string> ParsedArgs::get(std::string_view flag) const {
  auto it = values.find(std::string(flag));
  if (it == values.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::string ParsedArgs::get_or(std::string_view flag, std::string dflt) const {
  auto v = get(flag);
  return v ? *v : dflt;
}

long long ParsedArgs::get_int(std::string_view flag, long long dflt) const {
  auto v = get(flag);
  if (!v) return dflt;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno == ERANGE)
    throw UsageError(cat(flag, ": expected an integer, got '", *v, "'"));
  return x;
}

double ParsedArgs::get_double(std::string_view flag, double dflt) const {
  auto v = get(flag);
  if (!v) return dflt;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') throw UsageError(cat(flag, ": expected a number, got '", *v, "'"));
  return x;
}

ParsedArgs parse_args(const CommandSpec& spec, std::span<const std::string> args) {
  ParsedArgs out;
  bool variadic = !spec.positionals.empty() && spec.positionals.back().ends_with("...");
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!only_positionals && a == "--") {
      only_positionals = true;
      continue;
    }
    if (!only_positionals && (a == "--help" || a == "-h")) {
      out.help = true;
      return out;
    }
    if (!only_positionals && a.size() > 1 && a[0] == '-' && a != "-") {
      std::string name = a, inline_value;
      bool has_inline = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        inline_value = a.substr(eq + 1);
        has_inline = true;
      }
      const FlagSpec* f = nullptr;
      for (const auto& fs : spec.flags)
        if (fs.name == name) f = &fs;
      if (!f) throw UsageError(cat("unknown option '", name, "'"));
      if (!f->repeatable && out.values.count(name)) throw UsageError(cat("option ", name, " given twice"));
      if (f->value_name.empty()) {
        if (has_inline) throw UsageError(cat("option ", name, " takes no value"));
        out.values[name].push_back("");
      } else if (has_inline) {
        out.values[name].push_back(inline_value);
      } else {
        if (i + 1 >= args.size()) throw UsageError(cat("option ", name, " needs a value ", f->value_name));
        out.values[name].push_back(args[++i]);
      }
      continue;
    }
    out.positionals.push_back(a);
  }
  size_t fixed = spec.positionals.size() - (variadic ? 1 : 0);
  size_t need = std::max(spec.min_positionals, fixed);
  if (out.positionals.size() < need)
    throw UsageError(cat("missing argument ",
                         spec.positionals[std::min(out.positionals.size(), spec.positionals.size() - 1)]));
  if (!variadic && out.positionals.size() > spec.positionals.size())
    throw UsageError(cat("unexpected argument '", out.positionals[spec.positionals.size()], "'"));
  for (const auto& f : spec.flags)
    if (f.required && !out.values.count(f.name)) throw UsageError(cat("missing required option ", f.name));
  return out;
}

}  // namespace exl

#include <fstream>
#include <iostream>
#include <iterator>

#include "engine/generate/speculation.h"
#include "runtime/backend_select.h"
#include "runtime/job_engine.h"
#include "runtime/model_host.h"
#include "tools/mcp/mcp_client.h"

namespace exl {

int run_command(const CommandSpec& spec, std::span<const std::string> args,
                const std::function<int(const ParsedArgs&)>& body) {
  try {
    ParsedArgs p = parse_args(spec, args);
    if (p.help) {
      std::cout << spec.help();
      return 0;
    }
    return body(p);
  } catch (const UsageError& e) {
    std::cerr << "exlagent " << spec.name << ": error: " << e.what() << "\n" << spec.usage() << "\n";
    return 2;
  }
}

nlohmann::ordered_json read_schema_file(const std::string& path, std::string_view command) {
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in, "runtime: ", command, ": cannot read schema '", path, "'");
  try {
    return nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("runtime: ", command, ": schema '", path, "' is not valid JSON: ", e.what());
  }
}

std::vector<McpServerConfig> mcp_server_flags(const ParsedArgs& a, const std::string& flag) {
  std::vector<McpServerConfig> out;
  if (auto it = a.values.find(flag); it != a.values.end())
    for (const auto& v : it->second) {
      try {
        out.push_back(parse_mcp_server_flag(v));
      } catch (const UsageError&) {
        throw;
      } catch (const Error& e) {
        throw UsageError(e.what());
      }
    }
  return out;
}

std::string gpu_split_flag(const ParsedArgs& a, const std::string& backend) {
  const std::string v = a.get_or("--gpu-split", "");
  if (v.empty()) return v;
  try {
    parse_gpu_split(v, backend);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return v;
}

int tensor_parallel_flag(const ParsedArgs& a) {
  if (!a.has("--tensor-parallel")) return 0;
  const long long n = a.get_int("--tensor-parallel", 0);
  if (n < 1 || n > 64) throw UsageError(cat("--tensor-parallel must be 1 to 64, not ", n));
  if (n > 1 && a.has("--gpu-split")) throw UsageError("--gpu-split and --tensor-parallel cannot be combined");
  return int(n);
}

Speculation speculation_flag(const ParsedArgs& a) {
  const std::string v = a.get_or("--speculate", "auto");
  const auto s = parse_speculation(v);
  if (!s) throw UsageError(cat("--speculate must be none, ngram, draft or auto, not '", v, "'"));
  if (*s == Speculation::draft && !a.has("--draft-model")) throw UsageError("--speculate draft needs --draft-model DIR");
  return *s;
}

std::vector<FlagSpec> with_job_engine_flags(std::vector<FlagSpec> before, std::vector<FlagSpec> after) {
  before.insert(before.end(),
                {{"--backend", "NAME", "cpu (default) or cuda"},
                 {"--gpu-split", "GB,GB...|auto", k_gpu_split_help},
                 {"--tensor-parallel", "N", k_tensor_parallel_help},
                 {"--threads", "N", "CPU threads (default: all)"},
                 {"--speculate", "MODE", k_speculate_help},
                 {"--draft-model", "DIR", k_draft_model_help},
                 {"--chat-template", "NAME", "override the detected chat template (llama3, chatml, mistral, llama2)"}});
  before.insert(before.end(), std::make_move_iterator(after.begin()), std::make_move_iterator(after.end()));
  return before;
}

JobEngineOptions job_engine_options(const ParsedArgs& a, std::string model_dir, int max_batch_seqs) {
  JobEngineOptions eo;
  eo.model_dir = std::move(model_dir);
  eo.backend = a.get_or("--backend", "cpu");
  eo.gpu_split = gpu_split_flag(a, eo.backend);
  eo.tensor_parallel = tensor_parallel_flag(a);
  eo.cpu_threads = int(a.get_int("--threads", 0));
  eo.speculate = speculation_flag(a);
  eo.draft_model = a.get_or("--draft-model", "");
  eo.max_batch_seqs = max_batch_seqs;
  eo.chat_template = a.get_or("--chat-template", "");
  return eo;
}

ModelHostOptions model_host_options(const ParsedArgs& a) {
  ModelHostOptions o;
  o.model_dir = *a.get("--model");
  o.backend = a.get_or("--backend", "cpu");
  o.gpu_split = gpu_split_flag(a, o.backend);
  o.tensor_parallel = tensor_parallel_flag(a);
  o.cpu_threads = int(a.get_int("--threads", 0));
  if (a.has("--cache")) o.cache_format = kv_format_from_string(*a.get("--cache"));
  return o;
}

}  // namespace exl
