// Fuzz target: what tool clients send (runtime/server/remote_tool.h): a tool definition
// (parse_remote_tool_spec, whose inputSchema is then compiled by tools/argument_validator.h), a
// tools/call result (tool_result_from_mcp), and arguments checked against a fixed tool schema.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "grammar/grammar_budget.h"
#include "runtime/server/remote_tool.h"
#include "tools/argument_validator.h"

namespace exl::fuzz_tool_reply {

const ArgumentValidator& weather_validator() {
  static const ArgumentValidator v(nlohmann::json::parse(R"({"type":"object","properties":{
      "city":{"type":"string","minLength":1},"days":{"type":"integer","minimum":1,"maximum":14},
      "unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false})"));
  return v;
}

}  // namespace exl::fuzz_tool_reply

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(exl::fuzz::as_text(data, size), nullptr, false);
  if (j.is_discarded()) return 0;
  exl::fuzz::expect_clean([&] { exl::tool_result_from_mcp(j); });
  exl::fuzz::expect_clean([&] {
    exl::ToolSpec spec = exl::parse_remote_tool_spec(j);
    exl::GrammarBudget budget;
    budget.max_automaton_states = 20000;
    budget.max_states = 200000;
    budget.timeout = std::chrono::milliseconds(500);
    exl::GrammarBudgetScope scope(budget);
    exl::ArgumentValidator v(spec.input_schema);
    v.check(nlohmann::json::object());
  });
  exl::fuzz::expect_clean([&] { exl::fuzz_tool_reply::weather_validator().check(j); });
  return 0;
}
