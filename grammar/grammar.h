// A byte-level grammar: a set of rules, each a deterministic automaton over bytes whose states may
// also "call" other rules (a recursive transition network, i.e. a pushdown automaton). This is the
// compiled form of regexes and JSON Schemas; matchers step it one byte at a time.
//
// Two rule kinds:
//  - automaton: states with deterministic byte transitions (through a per-rule byte-class map),
//    a list of (callee, return state) call edges and an accepting flag. Calls and byte edges are
//    alternatives: a matcher follows all of them (the stack is nondeterministic, a set of stacks).
//  - repeat: `body` called between min and max times (max = kUnbounded for no limit). Its state is
//    the count, so counted repetitions cost O(1) grammar size whatever the count.
// Built through GrammarBuilder (NFA fragments with epsilon edges), then `finish` determinizes each
// rule, removes rules with an empty language and states that cannot reach acceptance, and rejects
// left recursion (a rule reaching itself without consuming a byte). Immutable afterwards and safe
// to share between threads.
#pragma once
#include <array>
#include <deque>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace exl {

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

struct CallEdge {
  int32_t callee;
  int32_t next;  // state to continue in once the callee accepted
};

struct DfaState {
  bool accepting = false;
  bool has_bytes = false;  // at least one byte transition
  std::vector<CallEdge> calls;
};

struct Rule {
  enum class Kind : uint8_t { automaton, repeat };
  Kind kind = Kind::automaton;
  std::string name;
  // automaton
  std::array<uint8_t, 256> byte_class{};
  int32_t n_classes = 1;
  std::vector<int32_t> trans;  // state * n_classes + class -> state or -1
  std::vector<DfaState> states;
  // repeat
  int32_t body = -1;
  uint32_t min = 0, max = 0;

  int32_t step(int32_t state, uint8_t b) const { return trans[size_t(state) * n_classes + byte_class[b]]; }
};

struct Grammar {
  std::vector<Rule> rules;
  int32_t root = 0;  // the rule a whole input must match
  size_t total_states() const;
};

// One rule under construction: an NFA with a start (0) and a final (1) state.
struct NfaEdge {
  enum class Kind : uint8_t { eps, bytes, call };
  Kind kind;
  uint8_t lo = 0, hi = 0;
  int32_t callee = -1;
  int32_t to;
};

struct Nfa {
  std::vector<std::vector<NfaEdge>> out{2};
  int32_t add_state() {
    out.emplace_back();
    return int32_t(out.size() - 1);
  }
};

// A piece of an NFA between two of its states.
struct Frag {
  int32_t in, out;
};

// Builds fragments inside one Nfa. Every function returns a fresh fragment.
class FragBuilder {
 public:
  explicit FragBuilder(Nfa& nfa) : nfa_(&nfa) {}
  Frag empty();
  Frag bytes(uint8_t lo, uint8_t hi);
  Frag literal(std::string_view s);
  Frag call(int32_t rule);
  Frag seq(std::initializer_list<Frag> parts);
  Frag seq(const std::vector<Frag>& parts);
  Frag alt(const std::vector<Frag>& parts);  // no parts: the empty language
  Frag star(Frag f);
  Frag plus(Frag f);
  Frag opt(Frag f);
  Frag dfa(const struct Rule& byte_dfa);  // a copy of a byte-only DFA (as from determinize_bytes)
  void eps(int32_t from, int32_t to);
  void set_root(Frag f);  // connect the rule's start/final to f
  Nfa& nfa() { return *nfa_; }

 private:
  Nfa* nfa_;
};

class GrammarBuilder {
 public:
  int32_t add_rule(std::string name);  // an automaton rule with an empty NFA (empty language)
  int32_t add_repeat(std::string name, int32_t body, uint32_t min, uint32_t max);
  Nfa& nfa(int32_t rule) { return nfas_[size_t(rule)]; }
  FragBuilder frags(int32_t rule) { return FragBuilder(nfas_[size_t(rule)]); }
  const std::string& name(int32_t rule) const { return names_[size_t(rule)]; }
  size_t size() const { return nfas_.size(); }
  // Replaces rule's NFA by the byte-only DFA `d` (as produced by determinize_bytes).
  void set_from_dfa(int32_t rule, const Rule& d);
  // Makes rule the byte-only DFA `d` as it is: finish takes it without determinizing again (for
  // large automata built directly, such as length-bounded strings).
  void set_dfa(int32_t rule, std::shared_ptr<const Rule> d);
  // Determinizes every rule (each within the active GrammarBudget's per-automaton limit, all
  // charged to it: grammar/grammar_budget.h) and prunes; throws GrammarError. Rules equal to an
  // earlier one once their callees are merged (same NFA, same repeat, same set_dfa automaton; not
  // recursive ones) are determinized once: every call goes to the first, the copies forward to it.
  Grammar finish(int32_t root);

 private:
  friend Rule determinize_rule(const GrammarBuilder&, int32_t, size_t);
  // Per rule, the rule it equals (itself when none came before): see finish.
  std::vector<int32_t> merge_equal_rules();
  std::deque<Nfa> nfas_;  // a deque: FragBuilders keep pointers while rules are added
  std::vector<std::string> names_;
  std::vector<Rule> repeats_;  // kind == repeat entries, by rule id (others kind automaton unused)
  std::vector<bool> is_repeat_;
  std::vector<std::shared_ptr<const Rule>> ready_;  // by rule id; set_dfa rules
};

// Determinizes one NFA that has no call edges (a pure byte language). Throws when it has calls or
// more than max_states states.
Rule determinize_bytes(const Nfa& nfa, std::string name, size_t max_states);
// Product automata of two byte-only DFAs: intersection (a AND b) or difference (a AND NOT b).
Rule intersect_bytes(const Rule& a, const Rule& b, bool difference, size_t max_states);
// Calls of byte-only rules (directly or through one-call rules) that continue in equivalent
// states become one call of their union DFA, added to g (unless it passes max(4,096, 4 x its
// parts) or 20,000 states). Same language; finish calls it.
void merge_callfree_alternatives(Grammar& g);
// Whether no input at all matches the grammar (its root's language is empty: an unsatisfiable
// schema, a regex like [^\x00-\x{10FFFF}]).
bool accepts_nothing(const Grammar& g);
// Whether a byte-only DFA accepts nothing.
bool is_empty_bytes(const Rule& a);
// Whether a byte-only DFA accepts `s`.
bool accepts_bytes(const Rule& a, std::string_view s);

}  // namespace exl
