// Regular expressions (the ECMA-262 subset JSON Schema patterns use) compiled into byte-level
// automaton fragments.
//
// Syntax: literals, escapes (\n \r \t \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation),
// classes [..] with ranges, negation and \d \D \w \W \s \S inside or outside, '.' (any character
// but \n \r U+2028 U+2029), * + ? {m} {m,} {m,n} (lazy forms match the same language), groups
// ( ), (?: ), (?<name> ), alternation, and the anchors ^ and $ at the start and end of a
// top-level alternative, groups holding anchors distributed first ("^$|(^a+$)", "^([^,]|$)"); an
// alternative whose '^' follows a character or whose '$' precedes one matches nothing. Errors (GrammarError "grammar: regex: '<pattern>' at <byte offset>: ..."):
// backreferences, look-around, \b \B, \p{..}, anchors elsewhere, malformed syntax.
//
// Semantics: full match (the whole input is one match) or search (JSON Schema `pattern`: the input
// contains a match; ^ and $ then pin it to the start/end). Characters are code points, matched
// as UTF-8, or in JSON-string mode as their escaped JSON form (see emit_code_set).
//
// Counted repetitions: up to kExpandLimit copies are expanded inline; larger counts become a
// repeat rule (GrammarBuilder::add_repeat) whose matcher state is the count, so memory stays O(1)
// in the count. In byte-only mode (no calls allowed, needed for automaton products) larger counts
// are expanded too, as a flat chain of copies (linear in the count), and a count whose copies
// would pass the per-automaton state limit (GrammarBudget) is refused before it is expanded:
// "grammar: regex: '<pattern>': the repetition {m,n} needs about N automaton states, more than
// the limit of L".
#pragma once
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/grammar_budget.h"

namespace exl {

struct RegexOptions {
  bool search = false;       // JSON Schema `pattern` semantics instead of full match
  bool json_string = false;  // characters as written inside a JSON string
  bool byte_only = false;    // never create repeat rules (result usable by intersect_bytes)
};

// Emits the language of `pattern` as a fragment of rule `rule`.
Frag emit_regex(GrammarBuilder& gb, int32_t rule, std::string_view pattern, const RegexOptions& opts);

// A whole grammar for a full-match regex over raw UTF-8 text, compiled under `budget` (unless a
// budget is already active on this thread).
Grammar compile_regex_grammar(std::string_view pattern, const GrammarBudget& budget = {});

}  // namespace exl
