#include "sessions/workflow.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "kernels/error.h"
#include "sessions/workflow_schema.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t dot = path.find('.', pos);
    out.emplace_back(path.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos));
    if (dot == std::string_view::npos) return out;
    pos = dot + 1;
  }
}

bool valid_path(std::string_view path) {
  const auto segs = split_path(path);
  static const std::set<std::string, std::less<>> roots = {"inputs", "steps", "item", "index"};
  if (!roots.count(segs[0])) return false;
  for (const auto& s : segs)
    if (s.empty() || s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                         std::string::npos)
      return false;
  return true;
}

std::string read_text(const std::filesystem::path& p, std::string_view what) {
  std::ifstream in(p, std::ios::binary);
  EXL_CHECK(in, "sessions: workflow: cannot read ", what, " '", p.string(), "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RefChecker {
  const Workflow& wf;
  std::vector<std::string>& problems;

  void check(std::string_view path, const WorkflowStep& step, size_t index, const std::string& where) {
    if (!valid_path(path)) {
      problems.push_back(cat(where, ": '", path, "' is not a path (inputs.NAME..., steps.NAME..., item..., index)"));
      return;
    }
    const auto segs = split_path(path);
    if (segs[0] == "inputs" && segs.size() > 1 && !wf.inputs.contains(segs[1]))
      problems.push_back(cat(where, ": '", path, "': there is no input '", segs[1], "'"));
    if (segs[0] == "steps" && segs.size() > 1) {
      bool earlier = false;
      for (size_t i = 0; i < index; ++i) earlier = earlier || wf.steps[i].name == segs[1];
      if (!earlier) problems.push_back(cat(where, ": '", path, "': there is no earlier step '", segs[1], "'"));
    }
    if ((segs[0] == "item" || segs[0] == "index") && (step.for_each.empty() || where.ends_with("for_each")))
      problems.push_back(cat(where, ": '", path, "': item and index exist only inside a for_each step"));
  }
};

// A count the schema has checked (an integer-valued number, not negative) as T, or an error when
// it is beyond T's range: converting it unchecked would wrap or, for a float, be undefined.
template <class T>
T step_count(const ojson& v, std::string_view where, const std::string& step, const char* key) {
  using lim = std::numeric_limits<T>;
  const bool fits = v.is_number_unsigned()  ? v.get<uint64_t>() <= uint64_t(lim::max())
                    : v.is_number_integer() ? v.get<int64_t>() >= 0 && uint64_t(v.get<int64_t>()) <= uint64_t(lim::max())
                                            : v.get<double>() >= 0 && v.get<double>() < std::ldexp(1.0, lim::digits);
  EXL_CHECK(fits, "sessions: workflow: '", where, "': step '", step, "': '", key, "' must be at most ", lim::max(),
            ", got ", v.dump());
  return v.is_number_unsigned() ? T(v.get<uint64_t>()) : v.is_number_integer() ? T(v.get<int64_t>()) : T(v.get<double>());
}

WorkflowStep parse_step(const ojson& s, const ojson& defaults, std::string_view where) {
  WorkflowStep st;
  st.name = s["name"].get<std::string>();
  st.prompt = s["prompt"].get<std::string>();
  auto pick = [&](const char* k) -> const ojson* {
    if (auto it = s.find(k); it != s.end()) return &*it;
    if (auto it = defaults.find(k); it != defaults.end()) return &*it;
    return nullptr;
  };
  if (auto* v = pick("system")) st.system = v->get<std::string>();
  if (auto* v = pick("max_tokens")) st.max_tokens = step_count<int64_t>(*v, where, st.name, "max_tokens");
  if (auto* v = pick("temperature")) st.temperature = v->get<double>();
  if (auto* v = pick("seed")) st.seed = step_count<uint64_t>(*v, where, st.name, "seed");
  if (auto it = s.find("schema"); it != s.end()) st.schema = *it;
  if (auto it = s.find("continue"); it != s.end()) st.continue_from = it->get<std::string>();
  if (auto it = s.find("for_each"); it != s.end()) st.for_each = it->get<std::string>();
  if (auto it = s.find("tools"); it != s.end()) st.tools = it->get<std::vector<std::string>>();
  if (auto it = s.find("max_turns"); it != s.end()) st.max_turns = step_count<int>(*it, where, st.name, "max_turns");
  if (auto it = s.find("if"); it != s.end()) {
    WorkflowCondition c;
    if (it->is_string()) {
      c.path = it->get<std::string>();
    } else {
      c.path = (*it)["path"].get<std::string>();
      if (it->contains("equals")) c.equals = (*it)["equals"];
      if (it->contains("not_equals")) c.not_equals = (*it)["not_equals"];
    }
    st.condition = std::move(c);
  }
  return st;
}

}  // namespace

Workflow parse_workflow(const ojson& doc, const std::filesystem::path& base_dir,
                        const std::map<std::string, std::string>& overrides, std::string_view where) {
  const ojson schema = ojson::parse(workflow_schema_text());
  auto problems = schema_violations(schema, doc);
  auto report = [&] {
    std::string msg = cat("sessions: workflow: '", where, "': ", problems.size(), " problem",
                          problems.size() == 1 ? "" : "s", ":");
    for (const auto& p : problems) msg += "\n  " + p;
    fail(msg);
  };
  if (!problems.empty()) report();

  Workflow wf;
  wf.name = doc.value("name", std::string());
  if (auto m = doc.find("model"); m != doc.end()) wf.model = (base_dir / m->get<std::string>()).lexically_normal().string();
  if (auto in = doc.find("inputs"); in != doc.end())
    for (const auto& [k, v] : in->items()) {
      if (v.is_object() && v.size() == 1 && v.contains("file") && v["file"].is_string())
        wf.inputs[k] = read_text(base_dir / v["file"].get<std::string>(), cat("input '", k, "' file"));
      else
        wf.inputs[k] = v;
    }
  for (const auto& [k, v] : overrides) wf.inputs[k] = v;
  if (auto m = doc.find("mcp"); m != doc.end())
    for (const auto& [k, v] : m->items()) {
      try {
        EXL_CHECK(k.find('=') == std::string::npos, "--mcp: the server name '", k, "' must be 1 to 32 letters, digits or '-'");
        wf.mcp.push_back(parse_mcp_server_flag(cat(k, "=", v.get<std::string>())));
      } catch (const Error& e) {
        problems.push_back(cat("/mcp/", k, ": ", e.what()));
      }
    }
  const ojson defaults = doc.value("defaults", ojson::object());
  for (const auto& s : doc["steps"]) wf.steps.push_back(parse_step(s, defaults, where));

  std::set<std::string> names;
  RefChecker refs{wf, problems};
  for (size_t i = 0; i < wf.steps.size(); ++i) {
    const WorkflowStep& st = wf.steps[i];
    const std::string at = cat("/steps/", i, " ('", st.name, "')");
    if (!names.insert(st.name).second) problems.push_back(cat(at, ": the step name '", st.name, "' is used twice"));
    for (const auto& [field, text] : {std::pair<const char*, const std::string*>{"prompt", &st.prompt}, {"system", &st.system}}) {
      try {
        for (const auto& p : template_paths(*text)) refs.check(p, st, i, cat(at, "/", field));
      } catch (const Error& e) {
        problems.push_back(cat(at, "/", field, ": ", e.what()));
      }
    }
    if (!st.for_each.empty()) refs.check(st.for_each, st, i, cat(at, "/for_each"));
    if (st.condition) refs.check(st.condition->path, st, i, cat(at, "/if"));
    if (!st.continue_from.empty()) {
      size_t j = 0;
      while (j < i && wf.steps[j].name != st.continue_from) ++j;
      if (j == i) problems.push_back(cat(at, "/continue: there is no earlier step '", st.continue_from, "'"));
      else if (!wf.steps[j].for_each.empty())
        problems.push_back(cat(at, "/continue: step '", st.continue_from, "' is a for_each step (many conversations)"));
    }
  }
  if (!problems.empty()) report();
  return wf;
}

Workflow load_workflow(const std::filesystem::path& file, const std::map<std::string, std::string>& overrides) {
  const std::string text = read_text(file, "workflow file");
  ojson doc;
  try {
    doc = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("sessions: workflow: '", file.string(), "' is not valid JSON: ", e.what());
  }
  return parse_workflow(doc, file.parent_path(), overrides, file.string());
}

const ojson* resolve_path(const ojson& context, std::string_view path) {
  const ojson* v = &context;
  for (const auto& seg : split_path(path)) {
    if (v->is_object()) {
      auto it = v->find(seg);
      if (it == v->end()) return nullptr;
      v = &*it;
    } else if (v->is_array()) {
      if (seg.empty() || seg.find_first_not_of("0123456789") != std::string::npos || seg.size() > 9) return nullptr;
      const size_t i = std::stoul(seg);
      if (i >= v->size()) return nullptr;
      v = &(*v)[i];
    } else {
      return nullptr;
    }
  }
  return v;
}

std::vector<std::string> template_paths(std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("{{", pos)) != std::string_view::npos) {
    const size_t end = text.find("}}", pos + 2);
    EXL_CHECK(end != std::string_view::npos, "an unclosed '{{' at offset ", pos);
    std::string_view inner = text.substr(pos + 2, end - pos - 2);
    while (!inner.empty() && inner.front() == ' ') inner.remove_prefix(1);
    while (!inner.empty() && inner.back() == ' ') inner.remove_suffix(1);
    out.emplace_back(inner);
    pos = end + 2;
  }
  return out;
}

std::string render_template(std::string_view text, const ojson& context, std::string_view where) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find("{{", pos);
    if (open == std::string_view::npos) break;
    const size_t end = text.find("}}", open + 2);
    EXL_CHECK(end != std::string_view::npos, "sessions: workflow: ", where, ": an unclosed '{{' at offset ", open);
    out.append(text.substr(pos, open - pos));
    std::string_view inner = text.substr(open + 2, end - open - 2);
    while (!inner.empty() && inner.front() == ' ') inner.remove_prefix(1);
    while (!inner.empty() && inner.back() == ' ') inner.remove_suffix(1);
    const ojson* v = resolve_path(context, inner);
    EXL_CHECK(v, "sessions: workflow: ", where, ": '{{", inner, "}}' has no value");
    out += v->is_string() ? v->get<std::string>() : v->dump();
    pos = end + 2;
  }
  out.append(text.substr(std::min(pos, text.size())));
  return out;
}

bool is_truthy(const ojson* v) {
  if (!v || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number()) return v->get<double>() != 0;
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_array() || v->is_object()) return !v->empty();
  return true;
}

bool condition_holds(const WorkflowCondition& c, const ojson& context) {
  const ojson* v = resolve_path(context, c.path);
  if (c.equals) return v && *v == *c.equals;
  if (c.not_equals) return !v || *v != *c.not_equals;
  return is_truthy(v);
}

}  // namespace exl
