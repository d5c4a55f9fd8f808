// Fuzz target: the JSON Schema -> grammar compiler (grammar/json_schema.h) under a small budget
// (grammar/grammar_budget.h), so that a slow schema is a GrammarBudgetError, not a timeout. The
// first byte picks the options (whitespace, property order, lenient keywords); the rest is the
// schema text.
#include "fuzz/fuzz_support.h"
#include "grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  exl::JsonSchemaOptions opts;
  const uint8_t mode = data[0];
  opts.whitespace = static_cast<exl::JsonSchemaOptions::Whitespace>(mode % 3);
  opts.property_order = (mode & 4) ? exl::JsonSchemaOptions::PropertyOrder::any : exl::JsonSchemaOptions::PropertyOrder::schema;
  opts.ignore_unknown_keywords = (mode & 8) != 0;
  opts.integer_zero_fraction = (mode & 16) != 0;
  opts.budget.max_automaton_states = 20000;
  opts.budget.max_states = 200000;
  opts.budget.max_bytes = size_t(32) << 20;
  opts.budget.timeout = std::chrono::milliseconds(500);
  exl::fuzz::expect_clean([&] { exl::compile_json_schema_text(exl::fuzz::as_text(data + 1, size - 1), opts); });
  return 0;
}
