// The error type of the grammar layer: a regex or JSON Schema that cannot be compiled (or enforced
// exactly), or a misuse of a matcher. Messages start with "grammar: <concept>: " and name the bad
// input (a regex position, a JSON pointer).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace exl {

struct GrammarError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Parts>
[[noreturn]] void grammar_fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw GrammarError(os.str());
}

}  // namespace exl
