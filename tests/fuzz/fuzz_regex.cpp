// Fuzz target: the regex compiler (grammar/regex.h), full-match grammars of the pattern under a
// small budget.
#include "fuzz/fuzz_support.h"
#include "grammar/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exl::GrammarBudget budget;
  budget.max_automaton_states = 20000;
  budget.max_states = 200000;
  budget.max_bytes = size_t(32) << 20;
  budget.timeout = std::chrono::milliseconds(500);
  exl::fuzz::expect_clean([&] { exl::compile_regex_grammar(exl::fuzz::as_text(data, size), budget); });
  return 0;
}
