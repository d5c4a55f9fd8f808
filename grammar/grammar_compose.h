// Composition of finished grammars: literal text around compiled sub-grammars (a JSON Schema's
// grammar inside a tool-call wrapper), alternatives and separated lists of them. Works on
// finished Grammars, so each piece is compiled (and checked) on its own and then embedded
// unchanged: embedded rules keep their automata, only rule ids are shifted.
//
// Every rule a composer creates is a small deterministic automaton over bytes plus call edges;
// its states all reach acceptance and it starts with a byte or a call into an embedded grammar,
// never into itself, so the composed grammar satisfies the invariants GrammarBuilder::finish
// establishes (no left recursion, no dead states).
// Not thread-safe; the Grammar it produces is immutable like any other.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace exl {

// One step of a sequence: literal bytes, or a call to a rule of the composer.
struct SeqItem {
  std::string literal;
  int32_t rule = -1;
  static SeqItem text(std::string_view s) { return {std::string(s), -1}; }
  static SeqItem call(int32_t r) { return {{}, r}; }
};

class GrammarComposer {
 public:
  // Adds every rule of g; returns the id g's root has in the composed grammar.
  int32_t embed(const Grammar& g);
  // A rule matching the items in order. At least one item; empty literals are skipped, and a
  // sequence of nothing but empty literals is an error (it would match the empty string).
  int32_t sequence(std::string name, const std::vector<SeqItem>& items);
  // A rule matching any one of `rules` (non-empty).
  int32_t alternatives(std::string name, const std::vector<int32_t>& rules);
  // item (separator item)*, or just item when !many. The separator must be non-empty.
  int32_t list(std::string name, int32_t item, std::string_view separator, bool many);
  Grammar finish(int32_t root);

 private:
  int32_t add(Rule r);
  std::vector<Rule> rules_;
};

}  // namespace exl
