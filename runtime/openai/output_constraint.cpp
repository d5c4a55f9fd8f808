#include "runtime/openai/output_constraint.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "engine/generate/grammar_constraint.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "runtime/openai/api_error.h"
#include "sessions/tool_call_grammar.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;

// A small LRU of compiled grammars keyed by everything that shapes them.
class GrammarCache {
 public:
  template <class Make>
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, Make make) {
    {
      std::lock_guard lock(mu_);
      if (auto it = map_.find(key); it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        return it->second.first;
      }
    }
    std::shared_ptr<const CompiledGrammar> g = make();
    std::lock_guard lock(mu_);
    if (map_.count(key)) return map_[key].first;
    order_.push_front(key);
    map_[key] = {g, order_.begin()};
    if (map_.size() > kEntries) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    return g;
  }

 private:
  static constexpr size_t kEntries = 64;
  std::mutex mu_;
  std::list<std::string> order_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>> map_;
};

GrammarCache& cache() {
  static GrammarCache c;
  return c;
}

}  // namespace

std::shared_ptr<LogitsMaskHook> make_output_constraint(const ChatRequest& r, const Tokenizer& tok,
                                                       TemplateFamily family, const GrammarBudget& budget) {
  const bool calls = r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named;
  const bool json = r.response_format == "json_object" || r.response_format == "json_schema";
  if (!calls && !json) return nullptr;
  ToolCallGrammarOptions o;
  // json.dumps spacing: what chat models are trained to write (compact JSON forced on the demo
  // model wrecks its values; docs/websocket-api.md's agent turns use the same).
  o.schema_options.whitespace = JsonSchemaOptions::Whitespace::spaced;
  o.parallel_tool_calls = r.parallel_tool_calls;
  o.tool_name = r.tool_choice_name;
  if (calls) {
    o.mode = r.tool_choice == ToolChoice::named ? ToolCallMode::named : ToolCallMode::required;
  } else {
    o.final_schema = r.response_format == "json_object" ? Json{{"type", "object"}} : r.json_schema;
    o.mode = r.tool_choice == ToolChoice::auto_ && !r.tools.empty() ? ToolCallMode::call_or_final
                                                                     : ToolCallMode::final_answer;
  }
  const bool with_tools = o.mode != ToolCallMode::final_answer;
  const std::string key = cat(int(family), '|', int(o.mode), '|', o.parallel_tool_calls, '|', o.tool_name, '|',
                              o.final_schema.dump(), '|', with_tools ? r.tools.dump() : std::string(), '|',
                              reinterpret_cast<uintptr_t>(shared_token_index(tok).get()));
  std::shared_ptr<const CompiledGrammar> g;
  const char* param = calls ? "tools" : "response_format";
  try {
    g = cache().get(key, [&] {
      return with_grammar_budget(budget, [&] {
        std::vector<ToolCallSpec> tools = with_tools ? tool_specs_from_openai(r.tools) : std::vector<ToolCallSpec>{};
        return compile_grammar_for(tool_call_grammar(family, tools, o), tok);
      });
    });
  } catch (const GrammarCancelled& e) {
    throw ApiError(499, "invalid_request_error", cat("The request was cancelled: ", e.what()), param, "request_cancelled");
  } catch (const GrammarBudgetError& e) {
    bad_request(cat("This request's output constraint is too large to compile: ", e.what()), param,
                "grammar_budget_exceeded");
  } catch (const GrammarError& e) {
    bad_request(cat("This request's output constraint cannot be enforced: ", e.what()),
                calls ? "tools" : "response_format", "unsupported_schema");
  } catch (const Error& e) {
    bad_request(cat("This request's output constraint cannot be enforced: ", e.what()),
                calls ? "tool_choice" : "response_format", "unsupported_schema");
  }
  return make_grammar_constraint(std::move(g), tok);
}

}  // namespace exl
