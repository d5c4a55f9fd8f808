// What one grammar compilation may spend: automaton states, bytes and wall-clock time, and a
// cancellation callback. Every automaton the compiler builds (regex automata, subset
// constructions, products, length automata, the finished rules) charges the budget of the
// compilation running on its thread while it is built, so an oversized grammar is stopped early
// instead of after it has used the memory, and a cancelled request stops within milliseconds.
//
// Scope: a GrammarBudgetScope makes a budget the active one on its thread. Scopes nest: an inner
// scope while one is active changes nothing (the outer budget keeps counting), so the outermost
// caller — the server with its options and the request's cancellation — decides, and library
// entry points (compile_json_schema, compile_regex_grammar) fall back to the defaults below when
// nobody set one. Without any scope only the default per-automaton limit applies.
//
// Failure: GrammarBudgetError ("grammar: budget: ...", naming the limit) or GrammarCancelled,
// both GrammarErrors. The trip is sticky: once the budget is exceeded every later charge throws
// again, and with_grammar_budget re-throws the typed error even where code in between caught it
// and threw a plain GrammarError, so a cancelled or over-budget compilation never returns a
// grammar. Thread-safety: scopes and charges are per thread; `cancelled` is called on the
// compiling thread.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>

#include "grammar/grammar_error.h"

namespace exl {

struct GrammarBudget {
  size_t max_automaton_states = 200000;     // states of any one automaton (a rule, a regex, a product)
  size_t max_states = 8000000;              // states of all automata built, intermediate ones included
  size_t max_bytes = size_t(256) << 20;     // bytes of the finished rules plus the construction step running
  std::chrono::milliseconds timeout{5000};  // wall clock of the compilation; 0 = none
  std::function<bool()> cancelled;          // polled every few milliseconds; true stops the compilation
};

class GrammarBudgetScope {
 public:
  explicit GrammarBudgetScope(const GrammarBudget& budget);
  ~GrammarBudgetScope();
  GrammarBudgetScope(const GrammarBudgetScope&) = delete;
  GrammarBudgetScope& operator=(const GrammarBudgetScope&) = delete;

  // Throws GrammarBudgetError / GrammarCancelled when the active budget has tripped.
  void check() const;

 private:
  bool owner_ = false;
};

// Charges automaton states and bytes built on this thread to the active budget, and polls its
// clock and cancellation. Throws when a limit is passed.
void grammar_charge(size_t states, size_t bytes);
// Returns bytes charged for construction data that has been freed again.
void grammar_release(size_t bytes);
// Bytes charged while one construction step runs and released when it ends (however it ends).
class GrammarTransientBytes {
 public:
  GrammarTransientBytes() = default;
  GrammarTransientBytes(const GrammarTransientBytes&) = delete;
  GrammarTransientBytes& operator=(const GrammarTransientBytes&) = delete;
  ~GrammarTransientBytes() { grammar_release(bytes_); }
  void charge(size_t bytes) {
    bytes_ += bytes;
    grammar_charge(0, bytes);
  }

 private:
  size_t bytes_ = 0;
};
// Throws the active budget's GrammarBudgetError / GrammarCancelled when it has tripped (for code
// that caught a GrammarError and must tell a budget stop from a deterministic failure).
void grammar_budget_check();
// Polls the clock and cancellation only (for loops that build nothing countable).
void grammar_poll();
// The per-automaton state limit in force on this thread (the default without a scope).
size_t grammar_automaton_limit();
// What the active budget has been charged so far (zeros without a scope).
struct GrammarSpent {
  size_t states = 0, bytes = 0;
};
GrammarSpent grammar_spent();

// Runs f() under `budget` on this thread and returns its result; throws the budget's typed error
// when the budget tripped, whatever f threw or returned.
template <class F>
auto with_grammar_budget(const GrammarBudget& budget, F&& f) -> decltype(f()) {
  GrammarBudgetScope scope(budget);
  try {
    auto result = f();
    scope.check();
    return result;
  } catch (const GrammarError&) {
    scope.check();
    throw;
  }
}

}  // namespace exl
