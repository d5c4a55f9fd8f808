// The error type of the grammar layer: a regex or JSON Schema that cannot be compiled (or enforced
// exactly), or a misuse of a matcher. Messages start with "grammar: <concept>: " and name the bad
// input (a regex position, a JSON pointer). Two kinds are told apart by type: a compilation that
// passed its budget (grammar/grammar_budget.h) and one that was cancelled. All are exl::Errors
// (kernels/error.h): a caller that treats grammar errors apart catches them before exl::Error.
#pragma once
#include "kernels/error.h"

namespace exl {

struct GrammarError : Error {
  using Error::Error;
};

// The compilation needed more states, bytes or time than its GrammarBudget allows.
struct GrammarBudgetError : GrammarError {
  using GrammarError::GrammarError;
};

// The compilation's cancellation callback said stop (its request went away).
struct GrammarCancelled : GrammarError {
  using GrammarError::GrammarError;
};

template <class... Parts>
[[noreturn]] void grammar_fail(const Parts&... parts) {
  throw GrammarError(cat(parts...));
}

}  // namespace exl
